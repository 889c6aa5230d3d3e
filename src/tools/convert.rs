//! `karpenter convert`: v1beta1 NodePools and EC2NodeClasses rewritten as v1, following
//! upstream's v1 migration guide, each change told in a comment above the object.
//!
//! * NodePool: `karpenter.sh/v1`; `consolidationPolicy: WhenUnderutilized` becomes
//!   `WhenEmptyOrUnderutilized`; `consolidateAfter`, required in v1, is `0s` when it was not set
//!   (v1beta1 consolidated underutilized nodes at once); `disruption.expireAfter` moves into the
//!   template; `nodeClassRef` names its `group` instead of an `apiVersion`; the template's
//!   `kubelet` moves to the EC2NodeClass the NodePool uses.
//! * EC2NodeClass: `karpenter.k8s.aws/v1`; an `amiFamily` without `amiSelectorTerms` (v1beta1's
//!   default: AL2) becomes the alias term `<family>@latest`; the NodePools' `kubelet` arrives.
//!
//! What has no v1 equivalent (the Ubuntu AMI family, a `kubelet` whose EC2NodeClass is not in the
//! input, two NodePools asking one EC2NodeClass for different `kubelet` settings) is reported as
//! a problem: a comment on the object and a line of [`Conversion::problems`]. Other objects pass
//! through unchanged; a Karpenter object that is already v1 is an error.

use serde_json::{Map, Value, json};
use thiserror::Error;

use crate::tools::simulate::input::split_documents;

const NODEPOOL_V1BETA1: &str = "karpenter.sh/v1beta1";
const NODEPOOL_V1: &str = "karpenter.sh/v1";
const NODECLASS_V1BETA1: &str = "karpenter.k8s.aws/v1beta1";
const NODECLASS_V1: &str = "karpenter.k8s.aws/v1";

/// Why an input cannot be converted.
#[derive(Debug, Error)]
pub enum ConvertError {
    /// A file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A document is not YAML.
    #[error("{file}: document {document} (line {line}): invalid YAML: {message}")]
    Yaml {
        /// The file.
        file: String,
        /// 1-based document number.
        document: usize,
        /// Line the document starts on.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A document is not a Kubernetes object, or is a Karpenter object of another version.
    #[error("{file}: document {document}: {message}")]
    Object {
        /// The file.
        file: String,
        /// 1-based document number.
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// Two NodePools or two EC2NodeClasses of one name.
    #[error("{kind} {name} appears twice in the input")]
    Duplicate {
        /// NodePool or EC2NodeClass.
        kind: String,
        /// Its name.
        name: String,
    },
    /// The output could not be written as YAML.
    #[error("rendering YAML: {0}")]
    Render(String),
}

/// One converted (or passed-through) object.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// The object.
    pub object: Value,
    /// What was changed, one sentence each (comments above the object).
    pub changes: Vec<String>,
}

/// The result of a conversion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conversion {
    /// The objects, in input order.
    pub objects: Vec<Converted>,
    /// What could not be converted, one line each (also a comment on its object).
    pub problems: Vec<String>,
}

impl Conversion {
    /// The objects as a YAML stream, each preceded by comments naming its changes.
    pub fn to_yaml(&self) -> Result<String, ConvertError> {
        let mut out = String::new();
        for (i, converted) in self.objects.iter().enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            for change in &converted.changes {
                out.push_str(&format!("# karpenter convert: {change}\n"));
            }
            out.push_str(
                &serde_saphyr::to_string(&converted.object)
                    .map_err(|e| ConvertError::Render(e.to_string()))?,
            );
        }
        Ok(out)
    }
}

/// Converts the YAML files `paths` (their documents, in order).
pub fn convert_files(paths: &[std::path::PathBuf]) -> Result<Conversion, ConvertError> {
    let mut inputs = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConvertError::Read { path: path.display().to_string(), source })?;
        inputs.push((path.display().to_string(), text));
    }
    convert(&inputs)
}

/// Converts YAML texts, each named by its file.
pub fn convert(inputs: &[(String, String)]) -> Result<Conversion, ConvertError> {
    let mut objects = Vec::new();
    for (file, text) in inputs {
        for (index, (line, doc)) in split_documents(text).into_iter().enumerate() {
            let document = index + 1;
            let value: Value = serde_saphyr::from_str(&doc).map_err(|e| ConvertError::Yaml {
                file: file.clone(),
                document,
                line,
                // The parser's first line: its message (it may add a snippet of the document).
                message: e.to_string().lines().next().unwrap_or_default().to_string(),
            })?;
            if value.is_null() {
                continue;
            }
            let object_error =
                |message: String| ConvertError::Object { file: file.clone(), document, message };
            flatten(value, &mut objects).map_err(object_error)?;
        }
    }
    // One object per kind and name: kubelet settings and problems go to the right one.
    let mut seen = std::collections::HashSet::new();
    for object in &objects {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        if matches!(kind, "NodePool" | "EC2NodeClass") && !seen.insert((kind.to_string(), name_of(object))) {
            return Err(ConvertError::Duplicate { kind: kind.to_string(), name: name_of(object) });
        }
    }
    Ok(convert_objects(objects))
}

/// Adds `value` (the items of a `List`, one by one) to `objects`; a Karpenter object that is
/// already v1 is an error.
fn flatten(value: Value, objects: &mut Vec<Value>) -> Result<(), String> {
    if !value.is_object() {
        return Err("expected a Kubernetes object (a mapping with apiVersion and kind)".into());
    }
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "List" {
        let items = value.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        for item in items {
            flatten(item, objects)?;
        }
        return Ok(());
    }
    if matches!((kind, api_version), ("NodePool", NODEPOOL_V1) | ("EC2NodeClass", NODECLASS_V1)) {
        return Err(format!("{kind} {} is already {api_version}: nothing to convert", name_of(&value)));
    }
    objects.push(value);
    Ok(())
}

fn name_of(value: &Value) -> String {
    value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("(unnamed)").to_string()
}

fn is(value: &Value, kind: &str, api_version: &str) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(kind)
        && value.get("apiVersion").and_then(Value::as_str) == Some(api_version)
}

/// A NodePool's reference to its node class, and the kubelet settings leaving its template.
struct PoolRef {
    pool: String,
    group: String,
    kind: String,
    class: String,
    kubelet: Option<Value>,
}

/// Converts parsed objects (see the module documentation).
pub fn convert_objects(objects: Vec<Value>) -> Conversion {
    let mut out = Conversion::default();
    let mut refs: Vec<PoolRef> = Vec::new();
    for object in objects {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
        let converted = if is(&object, "NodePool", NODEPOOL_V1BETA1) {
            let (converted, reference) = nodepool(object);
            refs.push(reference);
            converted
        } else if is(&object, "EC2NodeClass", NODECLASS_V1BETA1) {
            nodeclass(object, &mut out.problems)
        } else if api_version.starts_with("karpenter.sh/") || api_version.starts_with("karpenter.k8s.aws/") {
            let problem = format!(
                "{} {} ({api_version}) is not converted: only v1beta1 NodePools and EC2NodeClasses are",
                object.get("kind").and_then(Value::as_str).unwrap_or_default(),
                name_of(&object)
            );
            out.problems.push(problem.clone());
            Converted { object, changes: vec![format!("PROBLEM: {problem}")] }
        } else {
            Converted { object, changes: Vec::new() }
        };
        out.objects.push(converted);
    }
    move_kubelets(&mut out, &refs);
    out
}

/// Moves each NodePool's kubelet settings to the EC2NodeClass it uses, when every NodePool using
/// that class asks for the same settings (in v1 they apply to all of them); reports the rest.
fn move_kubelets(out: &mut Conversion, refs: &[PoolRef]) {
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut moved: Vec<(String, Value, Vec<String>)> = Vec::new();
    for r in refs.iter().filter(|r| r.kubelet.is_some()) {
        if r.group != "karpenter.k8s.aws" || r.kind != "EC2NodeClass" {
            problems.push((r.pool.clone(), format!(
                "NodePool {}: its kubelet settings have no place in v1: its nodeClassRef is {}/{}, not an EC2NodeClass",
                r.pool, r.group, r.kind
            )));
            continue;
        }
        if moved.iter().any(|(class, _, _)| *class == r.class) {
            continue;
        }
        let users: Vec<&PoolRef> =
            refs.iter().filter(|u| u.class == r.class && u.group == r.group && u.kind == r.kind).collect();
        let differing: Vec<String> = users
            .iter()
            .filter(|u| u.kubelet != r.kubelet)
            .map(|u| match &u.kubelet {
                Some(k) => format!("{} ({})", u.pool, k),
                None => format!("{} (none)", u.pool),
            })
            .collect();
        if !differing.is_empty() {
            for u in users.iter().filter(|u| u.kubelet.is_some()) {
                problems.push((u.pool.clone(), format!(
                    "NodePool {}: in v1 kubelet settings belong to EC2NodeClass {}, which NodePools with other settings use too ({}): give this NodePool an EC2NodeClass of its own",
                    u.pool, r.class, differing.join(", ")
                )));
            }
            moved.push((r.class.clone(), Value::Null, Vec::new()));
            continue;
        }
        let pools = users.iter().map(|u| u.pool.clone()).collect();
        moved.push((r.class.clone(), r.kubelet.clone().unwrap_or(Value::Null), pools));
    }
    for (class, settings, pools) in moved.into_iter().filter(|(_, s, _)| !s.is_null()) {
        let target = out
            .objects
            .iter_mut()
            .find(|c| is(&c.object, "EC2NodeClass", NODECLASS_V1) && name_of(&c.object) == class);
        match target {
            Some(target) => {
                if let Some(spec) = target.object.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.insert("kubelet".into(), settings);
                }
                target.changes.push(format!(
                    "spec.kubelet moved here from the template of NodePool(s) {}",
                    pools.join(", ")
                ));
            }
            None => {
                for pool in pools {
                    problems.push((pool.clone(), format!(
                        "NodePool {pool}: its kubelet settings belong on EC2NodeClass {class} in v1, which is not in the input: add `kubelet: {settings}` to its spec"
                    )));
                }
            }
        }
    }
    for (pool, problem) in problems {
        if let Some(p) = out
            .objects
            .iter_mut()
            .find(|c| is(&c.object, "NodePool", NODEPOOL_V1) && name_of(&c.object) == pool)
        {
            p.changes.push(format!("PROBLEM: {problem}"));
        }
        out.problems.push(problem);
    }
}

fn object_at<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut current = value;
    for key in path {
        current = current.get_mut(*key)?;
    }
    current.as_object_mut()
}

/// Drops what the API server set (`status`, uid, resourceVersion, ...), so that the output of
/// `kubectl get -o yaml` converts into something to apply.
fn strip_server_fields(object: &mut Value, changes: &mut Vec<String>) {
    let mut dropped = Vec::new();
    if let Some(map) = object.as_object_mut()
        && map.remove("status").is_some()
    {
        dropped.push("status");
    }
    if let Some(meta) = object_at(object, &["metadata"]) {
        for key in
            ["uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "finalizers"]
        {
            if meta.remove(key).is_some() {
                dropped.push(key);
            }
        }
        let mut no_annotations_left = false;
        if let Some(Value::Object(annotations)) = meta.get_mut("annotations") {
            for key in [
                "kubectl.kubernetes.io/last-applied-configuration",
                "compatibility.karpenter.sh/v1beta1-kubelet-conversion",
                "karpenter.sh/nodepool-hash",
                "karpenter.sh/nodepool-hash-version",
                "karpenter.k8s.aws/ec2nodeclass-hash",
                "karpenter.k8s.aws/ec2nodeclass-hash-version",
            ] {
                if annotations.remove(key).is_some() {
                    dropped.push(key);
                }
            }
            no_annotations_left = annotations.is_empty();
        }
        if no_annotations_left {
            meta.remove("annotations");
        }
    }
    if !dropped.is_empty() {
        changes.push(format!("dropped what the API server sets: {}", dropped.join(", ")));
    }
}

/// A v1beta1 NodePool as v1, and its reference to its node class.
fn nodepool(mut object: Value) -> (Converted, PoolRef) {
    let mut changes = vec![format!("apiVersion {NODEPOOL_V1BETA1} -> {NODEPOOL_V1}")];
    object["apiVersion"] = json!(NODEPOOL_V1);
    strip_server_fields(&mut object, &mut changes);
    let mut expire_after = None;
    if let Some(disruption) = object_at(&mut object, &["spec", "disruption"]) {
        if disruption.get("consolidationPolicy").and_then(Value::as_str) == Some("WhenUnderutilized") {
            disruption.insert("consolidationPolicy".into(), json!("WhenEmptyOrUnderutilized"));
            changes.push(
                "spec.disruption.consolidationPolicy WhenUnderutilized -> WhenEmptyOrUnderutilized".into(),
            );
        }
        if !disruption.contains_key("consolidateAfter") {
            disruption.insert("consolidateAfter".into(), json!("0s"));
            changes.push(
                "spec.disruption.consolidateAfter: 0s (required in v1; v1beta1 consolidated at once)".into(),
            );
        }
        expire_after = disruption.remove("expireAfter");
    } else if let Some(spec) = object_at(&mut object, &["spec"]) {
        spec.insert(
            "disruption".into(),
            json!({"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s"}),
        );
        changes.push(
            "spec.disruption: v1beta1's defaults written out (WhenEmptyOrUnderutilized, consolidateAfter 0s)"
                .into(),
        );
    }
    let pool = name_of(&object);
    let mut reference = PoolRef {
        pool,
        group: "karpenter.k8s.aws".into(),
        kind: "EC2NodeClass".into(),
        class: String::new(),
        kubelet: None,
    };
    if let Some(template) = object_at(&mut object, &["spec", "template", "spec"]) {
        if let Some(expire) = expire_after {
            template.insert("expireAfter".into(), expire);
            changes.push("spec.disruption.expireAfter moved to spec.template.spec.expireAfter".into());
        }
        if let Some(Value::Object(r)) = template.get_mut("nodeClassRef") {
            let old = r.remove("apiVersion");
            let group = match old.as_ref().and_then(Value::as_str) {
                Some(v) => v.split_once('/').map(|(g, _)| g).unwrap_or_default().to_string(),
                None => "karpenter.k8s.aws".to_string(),
            };
            r.insert("group".into(), json!(group));
            let kind =
                r.entry("kind").or_insert(json!("EC2NodeClass")).as_str().unwrap_or_default().to_string();
            reference.class = r.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            reference.group = group.clone();
            reference.kind = kind;
            changes.push(format!(
                "spec.template.spec.nodeClassRef names group {group} instead of an apiVersion"
            ));
        }
        if template.remove("resources").is_some() {
            changes.push("spec.template.spec.resources dropped (v1 has no such field)".into());
        }
        if let Some(settings) = template.remove("kubelet") {
            changes.push(format!("spec.template.spec.kubelet moves to EC2NodeClass {}", reference.class));
            reference.kubelet = Some(settings);
        }
    }
    (Converted { object, changes }, reference)
}

/// v1beta1's instance metadata options (v1 lowers the hop limit to 1).
fn v1beta1_metadata_options() -> Value {
    json!({"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 2, "httpTokens": "required"})
}

/// A v1beta1 EC2NodeClass as v1.
fn nodeclass(mut object: Value, problems: &mut Vec<String>) -> Converted {
    let name = name_of(&object);
    let mut changes = vec![format!("apiVersion {NODECLASS_V1BETA1} -> {NODECLASS_V1}")];
    object["apiVersion"] = json!(NODECLASS_V1);
    strip_server_fields(&mut object, &mut changes);
    let Some(spec) = object_at(&mut object, &["spec"]) else {
        return Converted { object, changes };
    };
    let hop_note =
        "(v1's default is 1, which leaves pods without host networking no access to the instance metadata)";
    match spec.get_mut("metadataOptions") {
        Some(Value::Object(options)) => {
            if !options.contains_key("httpPutResponseHopLimit") {
                options.insert("httpPutResponseHopLimit".into(), json!(2));
                changes.push(format!(
                    "metadataOptions.httpPutResponseHopLimit: 2, v1beta1's default, written out {hop_note}"
                ));
            }
        }
        _ => {
            spec.insert("metadataOptions".into(), v1beta1_metadata_options());
            changes.push(format!("metadataOptions: v1beta1's defaults written out, hop limit 2 {hop_note}"));
        }
    }
    let has_terms = spec.get("amiSelectorTerms").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    let family = spec.get("amiFamily").and_then(Value::as_str).map(str::to_string);
    let alias = |family: &str| match family {
        "AL2" => Some("al2"),
        "AL2023" => Some("al2023"),
        "Bottlerocket" => Some("bottlerocket"),
        "Windows2019" => Some("windows2019"),
        "Windows2022" => Some("windows2022"),
        _ => None,
    };
    let mut problem = |problem: String, changes: &mut Vec<String>| {
        changes.push(format!("PROBLEM: {problem}"));
        problems.push(problem);
    };
    match (family.as_deref(), has_terms) {
        (None, _) => problem(
            format!("EC2NodeClass {name}: no amiFamily (v1beta1 required one): choose the AMIs with amiSelectorTerms"),
            &mut changes,
        ),
        (Some("Ubuntu"), true) => {
            spec.insert("amiFamily".into(), json!("AL2"));
            changes.push("amiFamily Ubuntu -> AL2 (v1 has no Ubuntu family; Ubuntu AMIs take AL2's user data)".into());
            if !spec.contains_key("blockDeviceMappings") {
                spec.insert(
                    "blockDeviceMappings".into(),
                    json!([{"deviceName": "/dev/sda1", "rootVolume": true,
                        "ebs": {"encrypted": true, "volumeSize": "20Gi", "volumeType": "gp3"}}]),
                );
                changes.push(
                    "blockDeviceMappings: Ubuntu's root volume written out (/dev/sda1, 20Gi gp3, encrypted, rootVolume)".into(),
                );
            }
        }
        (Some("Ubuntu"), false) => problem(
            format!("EC2NodeClass {name}: amiFamily Ubuntu has no v1 equivalent: select your Ubuntu AMIs with amiSelectorTerms and set amiFamily AL2, or move to AL2023"),
            &mut changes,
        ),
        (Some("Custom"), true) => changes.push(
            "amiFamily Custom: in v1 the user data must register the node with the taint karpenter.sh/unregistered:NoExecute".into(),
        ),
        (Some("Custom"), false) => {
            problem(format!("EC2NodeClass {name}: amiFamily Custom needs amiSelectorTerms in v1"), &mut changes)
        }
        (Some(_), true) => {}
        (Some(family), false) => match alias(family) {
            Some(alias) => {
                spec.remove("amiFamily");
                spec.insert("amiSelectorTerms".into(), json!([{"alias": format!("{alias}@latest")}]));
                changes.push(format!(
                    "amiFamily {family} -> amiSelectorTerms [{{alias: {alias}@latest}}] (@latest follows each new AMI; pin a version to choose when nodes move)"
                ));
            }
            None => problem(format!("EC2NodeClass {name}: amiFamily {family} is not one v1 knows"), &mut changes),
        },
    }
    Converted { object, changes }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Conversion {
        convert(&[("in.yaml".to_string(), text.to_string())]).unwrap()
    }

    const POOL: &str = r#"
apiVersion: karpenter.sh/v1beta1
kind: NodePool
metadata:
  name: default
spec:
  template:
    spec:
      nodeClassRef:
        apiVersion: karpenter.k8s.aws/v1beta1
        kind: EC2NodeClass
        name: default
      kubelet:
        maxPods: 110
      requirements:
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["spot"]
  disruption:
    consolidationPolicy: WhenUnderutilized
    expireAfter: 720h
  limits:
    cpu: 1000
"#;

    const CLASS: &str = r#"
apiVersion: karpenter.k8s.aws/v1beta1
kind: EC2NodeClass
metadata:
  name: default
spec:
  amiFamily: AL2023
  role: KarpenterNodeRole-demo
  subnetSelectorTerms:
    - tags:
        karpenter.sh/discovery: demo
  securityGroupSelectorTerms:
    - tags:
        karpenter.sh/discovery: demo
"#;

    #[test]
    fn a_nodepool_and_its_class_convert_as_the_migration_guide_says() {
        let out = run(&format!("{POOL}---{CLASS}"));
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        let pool = &out.objects[0].object;
        assert_eq!(pool["apiVersion"], "karpenter.sh/v1");
        assert_eq!(pool["spec"]["disruption"]["consolidationPolicy"], "WhenEmptyOrUnderutilized");
        assert_eq!(pool["spec"]["disruption"]["consolidateAfter"], "0s");
        assert!(pool["spec"]["disruption"].get("expireAfter").is_none());
        assert_eq!(pool["spec"]["template"]["spec"]["expireAfter"], "720h");
        assert_eq!(
            pool["spec"]["template"]["spec"]["nodeClassRef"],
            json!({"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"})
        );
        assert!(pool["spec"]["template"]["spec"].get("kubelet").is_none());
        assert_eq!(pool["spec"]["limits"]["cpu"], 1000, "the rest is kept");
        let class = &out.objects[1].object;
        assert_eq!(class["apiVersion"], "karpenter.k8s.aws/v1");
        assert_eq!(class["spec"]["amiSelectorTerms"], json!([{"alias": "al2023@latest"}]));
        assert!(class["spec"].get("amiFamily").is_none());
        assert_eq!(class["spec"]["kubelet"], json!({"maxPods": 110}));
        assert_eq!(class["spec"]["metadataOptions"]["httpPutResponseHopLimit"], 2, "v1beta1's default kept");
        let yaml = out.to_yaml().unwrap();
        assert!(
            yaml.contains("# karpenter convert: spec.template.spec.kubelet moves to EC2NodeClass default"),
            "{yaml}"
        );
        assert!(
            yaml.contains(
                "# karpenter convert: spec.kubelet moved here from the template of NodePool(s) default"
            ),
            "{yaml}"
        );
        // The output parses back into the v1 types.
        let again: Vec<Value> =
            split_documents(&yaml).into_iter().map(|(_, d)| serde_saphyr::from_str(&d).unwrap()).collect();
        let _: crate::apis::NodePool = serde_json::from_value(again[0].clone()).unwrap();
        let _: crate::apis::EC2NodeClass = serde_json::from_value(again[1].clone()).unwrap();
    }

    #[test]
    fn what_has_no_v1_equivalent_is_reported() {
        // The pool's class is not in the input.
        let out = run(POOL);
        assert_eq!(out.problems.len(), 1);
        assert!(
            out.problems[0].contains("not in the input") && out.problems[0].contains("maxPods"),
            "{:?}",
            out.problems
        );
        assert!(out.to_yaml().unwrap().contains("# karpenter convert: PROBLEM: NodePool default"));
        // Ubuntu without AMIs selected.
        let out = run(&CLASS.replace("AL2023", "Ubuntu"));
        assert!(out.problems[0].contains("Ubuntu"), "{:?}", out.problems);
        // No amiFamily (v1beta1 required one).
        let out = run(&CLASS.replace("  amiFamily: AL2023\n", ""));
        assert!(out.problems[0].contains("no amiFamily"), "{:?}", out.problems);
        // Two pools asking one class for different kubelets: neither moves.
        let other = POOL
            .replace("name: default\nspec:\n  template", "name: other\nspec:\n  template")
            .replace("110", "58");
        let out = run(&format!("{POOL}---{other}---{CLASS}"));
        assert_eq!(out.problems.len(), 2, "{:?}", out.problems);
        assert!(out.problems.iter().all(|p| p.contains("other settings")), "{:?}", out.problems);
        assert!(out.objects[2].object["spec"].get("kubelet").is_none());
        // A pool without kubelet settings shares the class: it would get them in v1.
        let plain = other.replace("      kubelet:\n        maxPods: 58\n", "");
        let out = run(&format!("{POOL}---{plain}---{CLASS}"));
        assert_eq!(out.problems.len(), 1, "{:?}", out.problems);
        assert!(out.problems[0].contains("other (none)"), "{:?}", out.problems);
        assert!(out.objects[2].object["spec"].get("kubelet").is_none());
        // The same settings in both: moved once.
        let same = other.replace("58", "110");
        let out = run(&format!("{POOL}---{same}---{CLASS}"));
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        assert_eq!(out.objects[2].object["spec"]["kubelet"], json!({"maxPods": 110}));
        // A pool of another node class kind keeps no kubelet and says so.
        let foreign = POOL.replace(
            "apiVersion: karpenter.k8s.aws/v1beta1\n        kind: EC2NodeClass",
            "apiVersion: karpenter.kwok.sh/v1alpha1\n        kind: KWOKNodeClass",
        );
        let out = run(&foreign);
        assert!(out.problems[0].contains("karpenter.kwok.sh/KWOKNodeClass"), "{:?}", out.problems);
        // Older Karpenter kinds are not converted, and say so.
        let out = run("apiVersion: karpenter.sh/v1alpha5\nkind: Provisioner\nmetadata:\n  name: old\n");
        assert!(out.problems[0].contains("is not converted"), "{:?}", out.problems);
    }

    #[test]
    fn ami_families_as_v1_has_them() {
        // amiFamily with selector terms: both kept.
        let with_terms = CLASS.replace(
            "  amiFamily: AL2023\n",
            "  amiFamily: AL2023\n  amiSelectorTerms:\n    - id: ami-0123\n",
        );
        let out = run(&with_terms);
        assert_eq!(out.objects[0].object["spec"]["amiFamily"], "AL2023");
        assert_eq!(out.objects[0].object["spec"]["amiSelectorTerms"], json!([{"id": "ami-0123"}]));
        // Ubuntu with its AMIs selected: AL2 and Ubuntu's root volume.
        let out = run(&with_terms.replace("AL2023", "Ubuntu"));
        assert!(out.problems.is_empty(), "{:?}", out.problems);
        let spec = &out.objects[0].object["spec"];
        assert_eq!(spec["amiFamily"], "AL2");
        assert_eq!(spec["blockDeviceMappings"][0]["deviceName"], "/dev/sda1");
        // A hop limit given is kept; one missing is v1beta1's.
        let given = CLASS.replace("  role:", "  metadataOptions:\n    httpPutResponseHopLimit: 1\n  role:");
        assert_eq!(
            run(&given).objects[0].object["spec"]["metadataOptions"],
            json!({"httpPutResponseHopLimit": 1})
        );
        let partial = CLASS.replace("  role:", "  metadataOptions:\n    httpTokens: optional\n  role:");
        assert_eq!(
            run(&partial).objects[0].object["spec"]["metadataOptions"],
            json!({"httpTokens": "optional", "httpPutResponseHopLimit": 2})
        );
    }

    #[test]
    fn kubectl_get_output_converts() {
        // A List, as `kubectl get nodepools,ec2nodeclasses -o yaml` prints it, with what the API
        // server set.
        let list = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: karpenter.sh/v1beta1
    kind: NodePool
    metadata: {name: default, uid: abc, resourceVersion: "7", generation: 3, annotations: {karpenter.sh/nodepool-hash: "123"}}
    spec:
      template:
        spec:
          nodeClassRef: {name: default}
          resources: {cpu: "4"}
          requirements: []
      disruption: {consolidationPolicy: WhenEmpty, consolidateAfter: 30s}
    status: {resources: {cpu: "4"}}
"#;
        let out = run(list);
        assert_eq!(out.objects.len(), 1);
        let pool = &out.objects[0].object;
        assert_eq!(pool["apiVersion"], "karpenter.sh/v1");
        assert!(pool.get("status").is_none());
        assert_eq!(pool["metadata"], json!({"name": "default"}));
        assert!(pool["spec"]["template"]["spec"].get("resources").is_none());
        assert_eq!(
            pool["spec"]["disruption"],
            json!({"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30s"})
        );
    }

    #[test]
    fn other_objects_pass_and_bad_input_is_an_error() {
        let out = run("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n");
        assert_eq!(out.objects[0].changes, Vec::<String>::new());
        let v1 = CLASS.replace("karpenter.k8s.aws/v1beta1", "karpenter.k8s.aws/v1");
        let err = convert(&[("in.yaml".into(), v1)]).unwrap_err().to_string();
        assert!(err.contains("already karpenter.k8s.aws/v1"), "{err}");
        let err = convert(&[("in.yaml".into(), "a: [".into())]).unwrap_err().to_string();
        assert!(err.starts_with("in.yaml: document 1 (line 1): invalid YAML"), "{err}");
        let err = convert(&[("in.yaml".into(), "- 1\n".into())]).unwrap_err().to_string();
        assert!(err.contains("expected a Kubernetes object"), "{err}");
        let err = convert(&[("a.yaml".into(), CLASS.into()), ("b.yaml".into(), CLASS.into())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("EC2NodeClass default appears twice"), "{err}");
    }
}
