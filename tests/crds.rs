//! The committed CRDs are exactly what the Rust types generate.

use std::path::Path;

use karpenter::apis::crds;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let rendered = crds::render_all().expect("CRDs render");
    let mut expected_files: Vec<String> = rendered.iter().map(|c| c.file_name.clone()).collect();
    for crd in &rendered {
        let path = dir.join(&crd.file_name);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} is missing ({e}); run `make crds`", path.display()));
        assert!(
            committed == crd.yaml,
            "{} differs from the Rust types; run `make crds` and commit the result",
            path.display()
        );
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("crds/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(present, expected_files, "crds/ holds files the types do not generate");
}

#[test]
fn crds_have_upstream_names_columns_and_categories() {
    let all = crds::all();
    let names: Vec<_> = all.iter().map(|c| c.metadata.name.clone().unwrap_or_default()).collect();
    assert_eq!(
        names,
        [
            "nodepools.karpenter.sh",
            "nodeclaims.karpenter.sh",
            "ec2nodeclasses.karpenter.k8s.aws",
            "nodeoverlays.karpenter.sh",
            "capacitybuffers.autoscaling.x-k8s.io"
        ]
    );
    for crd in &all {
        let (scope, category, version) = match crd.spec.names.kind.as_str() {
            "NodeOverlay" => ("Cluster", "karpenter", "v1alpha1"),
            "CapacityBuffer" => ("Namespaced", "autoscaling", "v1beta1"),
            _ => ("Cluster", "karpenter", "v1"),
        };
        assert_eq!(crd.spec.scope, scope);
        assert_eq!(crd.spec.names.categories.as_deref(), Some(&[category.to_string()][..]));
        let version_of = &crd.spec.versions[0];
        assert_eq!(version_of.name, version);
        let version = version_of;
        assert!(version.served && version.storage);
        assert!(
            version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "status subresource"
        );
    }
    let columns = |i: usize, wide: bool| -> Vec<String> {
        all[i].spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| wide || c.priority.unwrap_or(0) == 0)
            .map(|c| c.name.to_uppercase())
            .collect()
    };
    assert_eq!(columns(0, false), ["NODECLASS", "NODES", "READY", "AGE"]);
    assert_eq!(columns(0, true), ["NODECLASS", "NODES", "READY", "AGE", "WEIGHT", "CPU", "MEMORY"]);
    assert_eq!(columns(1, false), ["TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"]);
    assert_eq!(
        columns(1, true),
        [
            "TYPE",
            "CAPACITY",
            "ZONE",
            "NODE",
            "READY",
            "AGE",
            "IMAGEID",
            "ID",
            "NODEPOOL",
            "NODECLASS",
            "DRIFTED"
        ]
    );
    assert_eq!(
        columns(4, false),
        [
            "STRATEGY",
            "PODTEMPLATE",
            "REPLICAS",
            "CONDITIONSTYPE",
            "CONDITIONSSTATUS",
            "CONDITIONSREASON",
            "AGE"
        ]
    );
    assert_eq!(all[4].spec.names.short_names.as_deref(), Some(&["cb".to_string()][..]));
    assert_eq!(columns(3, false), ["READY", "AGE"]);
    assert_eq!(columns(3, true), ["READY", "AGE", "WEIGHT"]);
    assert_eq!(all[3].spec.names.short_names.as_deref(), Some(&["overlays".to_string()][..]));
    assert_eq!(columns(2, false), ["READY", "AGE"]);
    assert_eq!(columns(2, true), ["READY", "AGE", "ROLE"]);
    assert_eq!(
        all[2].spec.names.short_names.as_deref(),
        Some(&["ec2nc".to_string(), "ec2ncs".to_string()][..])
    );
}

/// The schema paths of `schema` (a JSON schema as JSON): `a.b`, `a[].b` for array items, `a{}`
/// for map values.
fn schema_paths(schema: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    if let Some(properties) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, sub) in properties {
            let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
            out.insert(path.clone());
            schema_paths(sub, &path, out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_paths(items, &format!("{prefix}[]"), out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        schema_paths(values, &format!("{prefix}{{}}"), out);
    }
}

#[test]
fn every_field_of_upstreams_crds_is_served() {
    let upstream = include_str!("fixtures/upstream/crd-schema-paths-v1.14.1.txt");
    let mut ours: std::collections::BTreeMap<(String, String), std::collections::BTreeSet<String>> =
        Default::default();
    for crd in crds::all() {
        let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
        for version in &crd.spec.versions {
            let schema = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
            let schema = serde_json::to_value(schema).unwrap();
            let mut paths = Default::default();
            schema_paths(&schema, "", &mut paths);
            ours.insert((file.clone(), version.name.clone()), paths);
        }
    }
    let mut missing = Vec::new();
    for line in upstream.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut parts = line.split(' ');
        let (file, version, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let served = ours.get(&(file.to_string(), version.to_string()));
        if !served.is_some_and(|p| p.contains(path)) {
            missing.push(line);
        }
    }
    assert!(
        missing.is_empty(),
        "upstream v1.14.1 has these schema paths and karpenter-rs not:\n{}",
        missing.join("\n")
    );
}
