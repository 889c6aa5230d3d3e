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

use crate::simulate::input::split_documents;

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
            if !value.is_object() {
                return Err(object_error(
                    "expected a Kubernetes object (a mapping with apiVersion and kind)".into(),
                ));
            }
            let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
            let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default();
            if matches!((kind, api_version), ("NodePool", NODEPOOL_V1) | ("EC2NodeClass", NODECLASS_V1)) {
                return Err(object_error(format!(
                    "{kind} {} is already {api_version}: nothing to convert",
                    name_of(&value)
                )));
            }
            objects.push(value);
        }
    }
    Ok(convert_objects(objects))
}

fn name_of(value: &Value) -> String {
    value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("(unnamed)").to_string()
}

fn is(value: &Value, kind: &str, api_version: &str) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(kind)
        && value.get("apiVersion").and_then(Value::as_str) == Some(api_version)
}

/// Converts parsed objects (see the module documentation).
pub fn convert_objects(objects: Vec<Value>) -> Conversion {
    let mut out = Conversion::default();
    // Kubelet settings leaving NodePools, by EC2NodeClass name: (NodePool, settings).
    let mut kubelets: Vec<(String, String, Value)> = Vec::new();
    for object in objects {
        let converted = if is(&object, "NodePool", NODEPOOL_V1BETA1) {
            let (converted, kubelet) = nodepool(object);
            if let Some((class, settings)) = kubelet {
                kubelets.push((class, name_of(&converted.object), settings));
            }
            converted
        } else if is(&object, "EC2NodeClass", NODECLASS_V1BETA1) {
            nodeclass(object, &mut out.problems)
        } else {
            Converted { object, changes: Vec::new() }
        };
        out.objects.push(converted);
    }
    // The kubelet settings, into their EC2NodeClasses.
    for (class, pool, settings) in kubelets {
        let target = out.objects.iter_mut().find(|c| {
            c.object.get("kind").and_then(Value::as_str) == Some("EC2NodeClass")
                && c.object.get("apiVersion").and_then(Value::as_str) == Some(NODECLASS_V1)
                && name_of(&c.object) == class
        });
        let problem = match target {
            None => Some(format!(
                "NodePool {pool}: its kubelet settings belong on EC2NodeClass {class} in v1, which is not in the input: add `kubelet: {}` to its spec",
                compact(&settings)
            )),
            Some(target) => match target.object.pointer("/spec/kubelet") {
                Some(existing) if existing != &settings => Some(format!(
                    "NodePool {pool}: its kubelet settings ({}) differ from those EC2NodeClass {class} already takes from another NodePool ({}): give this NodePool an EC2NodeClass of its own",
                    compact(&settings),
                    compact(existing)
                )),
                Some(_) => {
                    target
                        .changes
                        .push(format!("spec.kubelet is also NodePool {pool}'s (the same settings)"));
                    None
                }
                None => {
                    if let Some(spec) = target.object.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.insert("kubelet".into(), settings.clone());
                    }
                    target.changes.push(format!("spec.kubelet moved here from NodePool {pool}'s template"));
                    None
                }
            },
        };
        if let Some(problem) = problem {
            if let Some(p) = out.objects.iter_mut().find(|c| {
                c.object.get("kind").and_then(Value::as_str) == Some("NodePool") && name_of(&c.object) == pool
            }) {
                p.changes.push(format!("PROBLEM: {problem}"));
            }
            out.problems.push(problem);
        }
    }
    out
}

fn compact(value: &Value) -> String {
    value.to_string()
}

fn object_at<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let mut current = value;
    for key in path {
        current = current.get_mut(*key)?;
    }
    current.as_object_mut()
}

/// A v1beta1 NodePool as v1, and the kubelet settings leaving it (for its EC2NodeClass).
fn nodepool(mut object: Value) -> (Converted, Option<(String, Value)>) {
    let mut changes = vec![format!("apiVersion {NODEPOOL_V1BETA1} -> {NODEPOOL_V1}")];
    object["apiVersion"] = json!(NODEPOOL_V1);
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
    let mut kubelet = None;
    if let Some(template) = object_at(&mut object, &["spec", "template", "spec"]) {
        if let Some(expire) = expire_after {
            template.insert("expireAfter".into(), expire);
            changes.push("spec.disruption.expireAfter moved to spec.template.spec.expireAfter".into());
        }
        if let Some(Value::Object(reference)) = template.get_mut("nodeClassRef") {
            let old = reference.remove("apiVersion");
            let group = old
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|v| v.split('/').next())
                .filter(|g| !g.is_empty())
                .unwrap_or("karpenter.k8s.aws")
                .to_string();
            reference.insert("group".into(), json!(group));
            reference.entry("kind").or_insert(json!("EC2NodeClass"));
            changes.push(format!(
                "spec.template.spec.nodeClassRef names group {group} instead of an apiVersion"
            ));
        }
        if let Some(settings) = template.remove("kubelet") {
            let class = template
                .get("nodeClassRef")
                .and_then(|r| r.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            changes.push(format!("spec.template.spec.kubelet moved to EC2NodeClass {class}"));
            kubelet = Some((class, settings));
        }
    }
    (Converted { object, changes }, kubelet)
}

/// A v1beta1 EC2NodeClass as v1.
fn nodeclass(mut object: Value, problems: &mut Vec<String>) -> Converted {
    let name = name_of(&object);
    let mut changes = vec![format!("apiVersion {NODECLASS_V1BETA1} -> {NODECLASS_V1}")];
    object["apiVersion"] = json!(NODECLASS_V1);
    let Some(spec) = object_at(&mut object, &["spec"]) else {
        return Converted { object, changes };
    };
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
    match (family.as_deref(), has_terms) {
        (Some("Ubuntu"), _) => {
            spec.remove("amiFamily");
            let problem = format!(
                "EC2NodeClass {name}: amiFamily Ubuntu has no v1 equivalent: select your Ubuntu AMIs with amiSelectorTerms and set amiFamily AL2 (their user data format), or move to AL2023"
            );
            changes.push(format!("PROBLEM: {problem}"));
            problems.push(problem);
        }
        (Some("Custom"), false) => {
            let problem = format!("EC2NodeClass {name}: amiFamily Custom needs amiSelectorTerms in v1");
            changes.push(format!("PROBLEM: {problem}"));
            problems.push(problem);
        }
        (family, false) => {
            let family = family.unwrap_or("AL2");
            if let Some(alias) = alias(family) {
                spec.remove("amiFamily");
                spec.insert("amiSelectorTerms".into(), json!([{"alias": format!("{alias}@latest")}]));
                changes.push(format!(
                    "amiFamily {family} -> amiSelectorTerms [{{alias: {alias}@latest}}] (@latest follows each new AMI; pin a version to choose when nodes move)"
                ));
            } else {
                let problem = format!("EC2NodeClass {name}: amiFamily {family} is not one v1 knows");
                changes.push(format!("PROBLEM: {problem}"));
                problems.push(problem);
            }
        }
        (_, true) => {}
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
        let yaml = out.to_yaml().unwrap();
        assert!(
            yaml.contains("# karpenter convert: spec.template.spec.kubelet moved to EC2NodeClass default"),
            "{yaml}"
        );
        assert!(
            yaml.contains("# karpenter convert: spec.kubelet moved here from NodePool default's template"),
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
        // Ubuntu.
        let out = run(&CLASS.replace("AL2023", "Ubuntu"));
        assert!(out.problems[0].contains("Ubuntu"), "{:?}", out.problems);
        // Two pools asking one class for different kubelets.
        let other = POOL
            .replace("name: default\nspec:\n  template", "name: other\nspec:\n  template")
            .replace("110", "58");
        let out = run(&format!("{POOL}---{other}---{CLASS}"));
        assert_eq!(out.problems.len(), 1, "{:?}", out.problems);
        assert!(
            out.problems[0].starts_with("NodePool other") && out.problems[0].contains("differ"),
            "{:?}",
            out.problems
        );
    }

    #[test]
    fn defaults_and_selector_terms_as_v1beta1_meant_them() {
        // No amiFamily: v1beta1's default AL2.
        let out = run(&CLASS.replace("  amiFamily: AL2023\n", ""));
        assert_eq!(out.objects[0].object["spec"]["amiSelectorTerms"], json!([{"alias": "al2@latest"}]));
        // amiFamily with selector terms: both kept.
        let with_terms = CLASS.replace(
            "  amiFamily: AL2023\n",
            "  amiFamily: AL2023\n  amiSelectorTerms:\n    - id: ami-0123\n",
        );
        let out = run(&with_terms);
        assert_eq!(out.objects[0].object["spec"]["amiFamily"], "AL2023");
        assert_eq!(out.objects[0].object["spec"]["amiSelectorTerms"], json!([{"id": "ami-0123"}]));
        // WhenEmpty with its consolidateAfter: kept.
        let empty = POOL.replace(
            "consolidationPolicy: WhenUnderutilized",
            "consolidationPolicy: WhenEmpty\n    consolidateAfter: 30s",
        );
        let out = run(&format!("{empty}---{CLASS}"));
        assert_eq!(
            out.objects[0].object["spec"]["disruption"],
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
    }
}
