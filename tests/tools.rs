//! `karpenter explain`, `karpenter simulate --from-cluster` and `karpenter top` (in tmux) against
//! the real API server: a
//! cluster made of NodePools, Nodes, NodeClaims, pods and a PodDisruptionBudget whose causes are
//! known (a taint, a limit, a zone, a do-not-disrupt pod, a PDB, a budget), read by the binary as
//! a user runs it. No controller runs: the objects are the cluster's whole truth.
//!
//! Needs the local control plane (`make test` starts it); on its own it is ignored:
//! `eval "$(make -s cluster-up)" && cargo test --test tools -- --ignored` (with `KEEP=1` the
//! objects are left in the cluster for a look).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter::apis::{NodeClaim, NodePool, crds};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn karpenter(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_karpenter")).args(args).output().expect("run karpenter")
}

/// Runs `karpenter ARGS -o json` and parses its output; fails on a non-zero exit.
fn json_of(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = karpenter(&all);
    assert!(out.status.success(), "karpenter {all:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Runs `karpenter ARGS`, expecting exit 1 and a one-line error containing `needle`.
fn fails(args: &[&str], needle: &str, env: &[(&str, &str)]) {
    let out = Command::new(env!("CARGO_BIN_EXE_karpenter"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run karpenter");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "karpenter {args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(needle), "karpenter {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

async fn create<K>(client: &Client, namespace: Option<&str>, obj: Value) -> K
where
    K: Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K: Resource<DynamicType = ()>,
{
    let obj: K = serde_json::from_value(obj).unwrap();
    let gvk = kube::core::GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()));
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, &K::plural(&()));
    let api: Api<kube::api::DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let dynamic: kube::api::DynamicObject =
        serde_json::from_value(serde_json::to_value(&obj).unwrap()).unwrap();
    let created = api.create(&PostParams::default(), &dynamic).await.unwrap();
    serde_json::from_value(serde_json::to_value(created).unwrap()).unwrap()
}

#[derive(Clone)]
struct Names {
    id: String,
}

impl Names {
    fn pool(&self, what: &str) -> String {
        format!("{}-{what}", self.id)
    }
}

fn nodepool(name: &str, suite: &str, extra: Value) -> Value {
    let mut pool = json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
        "spec": {"template": {"metadata": {"labels": {"example.com/suite": suite}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": suite},
                "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s",
                "budgets": [{"nodes": "100%"}]}}});
    merge(&mut pool, extra);
    pool
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A registered, initialized node of `pool` (Node and NodeClaim) on a c6a.large in us-east-1a.
async fn managed_node(client: &Client, name: &str, pool: &str, n: usize) {
    let provider_id = format!("aws:///us-east-1a/i-0{:016x}", 0xfeed_0000u64 + n as u64);
    let labels = json!({"karpenter.sh/nodepool": pool, "node.kubernetes.io/instance-type": "c6a.large",
        "karpenter.sh/capacity-type": "on-demand", "topology.kubernetes.io/zone": "us-east-1a",
        "karpenter.sh/initialized": "true", "karpenter.sh/registered": "true", "kubernetes.io/hostname": name,
        "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"});
    let _: Node = create(
        client,
        None,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"providerID": provider_id},
            "status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "29"},
                "allocatable": {"cpu": "1930m", "memory": "3Gi", "pods": "29"}}}),
    )
    .await;
    let claim: NodeClaim = create(
        client,
        None,
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["c6a.large"]}]}}),
    )
    .await;
    let condition = |type_: &str| {
        json!({"type": type_, "status": "True", "reason": type_, "message": "",
            "lastTransitionTime": "2026-11-24T00:00:00Z"})
    };
    let status = json!({"status": {"providerID": provider_id, "nodeName": name,
        "capacity": {"cpu": "2", "memory": "4Gi", "pods": "29"},
        "conditions": [condition("Launched"), condition("Registered"), condition("Initialized")]}});
    let api: Api<NodeClaim> = Api::all(client.clone());
    api.patch_status(&claim.metadata.name.unwrap(), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The EC2NodeClass `name`, with the status its controller writes once it is resolved.
async fn ready_node_class(client: &Client, name: &str) {
    let _: karpenter::apis::EC2NodeClass = create(
        client,
        None,
        json!({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name},
            "spec": {"role": "KarpenterNodeRole", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": name}}],
                "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": name}}]}}),
    )
    .await;
    let status = json!({"status": {
        "subnets": [{"id": "subnet-0a", "zone": "us-east-1a"}, {"id": "subnet-0b", "zone": "us-east-1b"}],
        "securityGroups": [{"id": "sg-0a"}],
        "amis": [{"id": "ami-0a", "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}],
        "instanceProfile": format!("{name}-profile"),
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
            "lastTransitionTime": "2026-11-24T00:00:00Z"}]}});
    Api::<karpenter::apis::EC2NodeClass>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

fn bound_pod(name: &str, node: &str, labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations,
            "ownerReferences": []},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}}}]}})
}

async fn scenario(client: Client, names: Names) {
    let names = &names;
    let id = names.id.as_str();
    let ns = id;
    let _: Namespace =
        create(&client, None, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .await;
    let pools: [(&str, Value); 5] = [
        ("open", json!({})),
        (
            "tainted",
            json!({"spec": {"template": {"spec": {"taints": [{"key": "example.com/dedicated", "value": "db", "effect": "NoSchedule"}]}}}}),
        ),
        ("limited", json!({"spec": {"limits": {"cpu": "1"}}})),
        (
            "zoned",
            json!({"spec": {"template": {"spec": {"requirements": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]}]}}}}),
        ),
        ("frozen", json!({"spec": {"disruption": {"budgets": [{"nodes": "0"}]}}})),
    ];
    for (what, extra) in pools {
        let _: NodePool = create(&client, None, nodepool(&names.pool(what), id, extra)).await;
    }
    // The suite's EC2NodeClass, resolved and Ready as its controller leaves it; one NodePool
    // refers to a class that does not exist, and launches nothing.
    ready_node_class(&client, id).await;
    let classless =
        json!({"spec": {"template": {"spec": {"nodeClassRef": {"name": format!("{id}-missing")}}}}});
    let _: NodePool = create(&client, None, nodepool(&names.pool("classless"), id, classless)).await;
    managed_node(&client, &names.pool("dnd"), &names.pool("open"), 1).await;
    managed_node(&client, &names.pool("pdb"), &names.pool("open"), 2).await;
    managed_node(&client, &names.pool("idle"), &names.pool("frozen"), 3).await;
    let _: Pod = create(
        &client,
        Some(ns),
        bound_pod(
            "guarded",
            &names.pool("dnd"),
            json!({"app": "guarded"}),
            json!({"karpenter.sh/do-not-disrupt": "true"}),
        ),
    )
    .await;
    let _: Pod =
        create(&client, Some(ns), bound_pod("web-0", &names.pool("pdb"), json!({"app": "web"}), json!({})))
            .await;
    let _: PodDisruptionBudget = create(
        &client,
        Some(ns),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web-pdb"},
            "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}}}),
    )
    .await;
    // Pending: only the suite's NodePools carry its label, no node does.
    let _: Pod = create(
        &client,
        Some(ns),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending"},
            "spec": {"nodeSelector": {"example.com/suite": id, "topology.kubernetes.io/zone": "us-east-1a"},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "1500m"}}}]}}),
    )
    .await;
    let _: Deployment = create(
        &client,
        Some(ns),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "batch"},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "batch"}},
                "template": {"metadata": {"labels": {"app": "batch"}},
                    "spec": {"nodeSelector": {"example.com/suite": id},
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "1"}}}]}}}}),
    )
    .await;
    // kube-scheduler reports the pod unschedulable: what makes it the provisioner's.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pod = pods.get("pending").await.unwrap();
        let unschedulable = pod.status.and_then(|s| s.conditions).into_iter().flatten().any(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
        });
        if unschedulable {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "kube-scheduler never reported the pod unschedulable");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // explain pod: each NodePool's verdict, with the offending value.
    let pod = format!("{ns}/pending");
    let e = json_of(&["explain", "pod", &pod]);
    let verdict = |what: &str| -> Value {
        let name = names.pool(what);
        e["nodepools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["nodepool"] == name.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {e:#}"))
    };
    assert_eq!(verdict("open")["fits"], true, "{e:#}");
    assert_eq!(verdict("open")["nodeClaim"]["zone"], "us-east-1a", "{e:#}");
    assert!(verdict("open")["nodeClaim"]["pricePerHour"].as_f64().unwrap() > 0.0);
    let why = |what: &str| verdict(what)["reason"].as_str().unwrap_or_default().to_string();
    assert_eq!(verdict("tainted")["fits"], false);
    assert!(
        why("tainted").contains("untolerated taint example.com/dedicated=db:NoSchedule"),
        "{}",
        why("tainted")
    );
    assert!(why("limited").contains("nodepool limits cpu"), "{}", why("limited"));
    assert!(
        why("zoned").contains("topology.kubernetes.io/zone") && why("zoned").contains("us-east-1a"),
        "{}",
        why("zoned")
    );
    assert_eq!(verdict("classless")["fits"], false, "{e:#}");
    assert!(
        why("classless").contains(&format!("EC2NodeClass \"{id}-missing\" not found")),
        "{}",
        why("classless")
    );
    assert_eq!(e["placement"]["kind"], "newNodeClaim", "{e:#}");
    // kube-scheduler's own words, whichever of its filters it names first (the suite's nodes have
    // no kubelet, so the node lifecycle controller may have tainted them by then).
    assert!(e["schedulerMessage"].as_str().is_some_and(|m| m.contains("nodes are available")), "{e:#}");
    let table = karpenter(&["explain", "pod", "pending", "-n", ns]);
    let table = String::from_utf8_lossy(&table.stdout);
    // Without -n, the namespace of the kubeconfig's context, as kubectl; --context picks another
    // context of the same kubeconfig.
    let kubeconfig = std::env::temp_dir().join(format!("{id}-kubeconfig"));
    let raw = Command::new("kubectl").args(["config", "view", "--raw"]).output().unwrap();
    std::fs::write(&kubeconfig, &raw.stdout).unwrap();
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl").arg("--kubeconfig").arg(&kubeconfig).args(args).output().unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let current = kubectl(&["config", "current-context"]);
    kubectl(&["config", "set-context", "--current", &format!("--namespace={ns}")]);
    kubectl(&["config", "set-context", "elsewhere", "--cluster=nowhere", "--user=nobody"]);
    let with_context_namespace = Command::new(env!("CARGO_BIN_EXE_karpenter"))
        .args(["explain", "pod", "pending", "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(
        with_context_namespace.status.success(),
        "{}",
        String::from_utf8_lossy(&with_context_namespace.stderr)
    );
    let e: Value = serde_json::from_slice(&with_context_namespace.stdout).unwrap();
    assert_eq!(e["pod"], pod.as_str(), "{e:#}");
    kubectl(&["config", "use-context", "elsewhere"]);
    let chosen = Command::new(env!("CARGO_BIN_EXE_karpenter"))
        .args(["explain", "node", &names.pool("idle"), "--context", &current, "-o", "json"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(chosen.status.success(), "--context {current}: {}", String::from_utf8_lossy(&chosen.stderr));
    let _ = std::fs::remove_file(&kubeconfig);
    assert!(
        table.contains("Placement:  a new NodeClaim of NodePool") && table.contains("WHY NOT"),
        "{table}"
    );

    // explain node / nodeclaim: what blocks each.
    let e = json_of(&["explain", "node", &names.pool("dnd")]);
    assert_eq!(
        (e["candidate"].as_bool(), e["code"].as_str()),
        (Some(false), Some("DoNotDisruptPod")),
        "{e:#}"
    );
    assert!(e["message"].as_str().unwrap().contains(&format!("{ns}/guarded")), "{e:#}");
    assert_eq!(e["pricePerHour"].as_f64().map(|p| p > 0.0), Some(true), "priced from the catalog: {e:#}");
    let e = json_of(&["explain", "nodeclaim", &names.pool("pdb")]);
    assert_eq!(e["code"], "PodDisruptionBudget", "{e:#}");
    assert!(e["message"].as_str().unwrap().contains(&format!("{ns}/web-pdb")), "{e:#}");
    let e = json_of(&["explain", "node", &names.pool("idle")]);
    assert_eq!((e["candidate"].as_bool(), e["code"].as_str()), (Some(true), Some("Budget")), "{e:#}");
    assert!(e["message"].as_str().unwrap().contains("Empty"), "{e:#}");
    assert_eq!(e["plan"]["decision"], "delete", "{e:#}");
    let idle_price = e["pricePerHour"].as_f64().unwrap();
    assert_eq!(e["expiry"]["expireAfter"], "720h", "{e:#}");
    let table =
        String::from_utf8_lossy(&karpenter(&["explain", "node", &names.pool("idle")]).stdout).to_string();
    assert!(table.contains("yes, but not now: No allowed disruptions"), "{table}");

    // simulate --from-cluster as the cluster is: no disruption command touches a node held by
    // its do-not-disrupt pod, its PodDisruptionBudget or its NodePool's zero budget.
    let r = json_of(&["simulate", "--from-cluster"]);
    let held = [names.pool("dnd"), names.pool("pdb"), names.pool("idle")];
    if let Some(command) = r.get("disruption").filter(|c| !c.is_null()) {
        let nodes = command["nodes"].as_array().unwrap();
        assert!(nodes.iter().all(|n| !held.iter().any(|h| n == h.as_str())), "{r:#}");
    }
    assert!(r["removedNodes"].as_array().unwrap().is_empty(), "{r:#}");

    // simulate --from-cluster -f: a pod added from a file is placed on a new NodeClaim.
    let dir = std::env::temp_dir().join(format!("{id}-inputs"));
    std::fs::create_dir_all(&dir).unwrap();
    let extra = dir.join("extra.yaml");
    std::fs::write(
        &extra,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: added, namespace: {ns}}}\nspec:\n  nodeSelector: {{example.com/suite: {id}}}\n  containers: [{{name: c, image: registry.k8s.io/pause:3.10, resources: {{requests: {{cpu: 500m}}}}}}]\n"
        ),
    )
    .unwrap();
    let r = json_of(&["simulate", "--from-cluster", "-f", extra.to_str().unwrap()]);
    let placed: Vec<&str> = r["provisioning"]["nodeClaims"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["pods"].as_array().unwrap().iter().filter_map(|p| p.as_str()))
        .collect();
    assert!(placed.contains(&format!("{ns}/added").as_str()), "{r:#}");

    // simulate --from-cluster: a Deployment scaled, a NodePool removed.
    let scale = format!("deployment/{ns}/batch=3");
    let r = json_of(&[
        "simulate",
        "--from-cluster",
        "--scale",
        &scale,
        "--remove-nodepool",
        &names.pool("frozen"),
    ]);
    assert!(r["removedNodes"].as_array().unwrap().iter().any(|n| n == names.pool("idle").as_str()), "{r:#}");
    let placed: Vec<String> = r["provisioning"]["nodeClaims"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()))
        .collect();
    for i in 0..3 {
        assert!(placed.contains(&format!("{ns}/batch-simulated-{i}")), "{r:#}");
    }
    assert!(placed.contains(&pod), "the pending pod too: {r:#}");
    // After: the removed node's price gone, the new NodeClaims' added, the next command's applied.
    let before = r["priceBeforePerHour"].as_f64().unwrap();
    let after = r["priceAfterPerHour"].as_f64().unwrap();
    let launched = r["provisioning"]["totalPricePerHour"].as_f64().unwrap();
    let command = match r.get("disruption") {
        None => 0.0,
        Some(c) => {
            let replacements: f64 = c["replacements"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["pricePerHour"].as_f64().unwrap())
                .sum();
            replacements - c["pricePerHour"].as_f64().unwrap()
        }
    };
    assert!(before > idle_price && launched > 0.0, "{r:#}");
    assert!((after - (before - idle_price + launched + command)).abs() < 1e-3, "{r:#}");

    // karpenter top: one frame for scripts, then the terminal view in a real terminal (tmux),
    // redrawn from the watches.
    let once = karpenter(&["top", "--once"]);
    let frame = String::from_utf8_lossy(&once.stdout).to_string();
    assert!(once.status.success(), "{}", String::from_utf8_lossy(&once.stderr));
    assert!(frame.contains(&format!("NodePool {}: 2 nodes, $0.", names.pool("open"))), "{frame}");
    assert!(frame.contains(&format!("NodePool {}: no nodes", names.pool("tainted"))), "{frame}");
    for (node, flag) in [("dnd", "blocked"), ("pdb", "blocked")] {
        let line = frame
            .lines()
            .find(|l| l.trim_start().starts_with(&names.pool(node)))
            .unwrap_or_else(|| panic!("{node} in {frame}"));
        assert!(
            line.contains("c6a.large") && line.contains("on-demand") && line.trim_end().ends_with(flag),
            "{line}"
        );
    }
    let data = json_of(&["top", "--once"]);
    let open = data["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["nodepool"] == names.pool("open").as_str())
        .unwrap_or_else(|| panic!("{data:#}"));
    assert_eq!(open["nodes"].as_array().map(Vec::len), Some(2), "{data:#}");
    top_in_a_terminal(&client, names).await;

    // A CapacityBuffer the controller resolved (its status as the controller writes it) keeps
    // room on the idle node: explain, top and simulate --from-cluster name it.
    let _: k8s_openapi::api::core::v1::PodTemplate = create(
        &client,
        Some(ns),
        json!({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "spare"},
            "template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": names.pool("idle")},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "500m"}}}]}}}),
    )
    .await;
    let _: karpenter::apis::CapacityBuffer = create(
        &client,
        Some(ns),
        json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer", "metadata": {"name": "spare"},
            "spec": {"podTemplateRef": {"name": "spare"}, "replicas": 1}}),
    )
    .await;
    let status = json!({"status": {"replicas": 1, "podTemplateRef": {"name": "spare"},
        "conditions": [{"type": "ReadyForProvisioning", "status": "True", "reason": "Resolved",
            "message": "Pod template resolved successfully", "lastTransitionTime": "2026-11-24T00:00:00Z"}]}});
    Api::<karpenter::apis::CapacityBuffer>::namespaced(client.clone(), ns)
        .patch_status("spare", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let buffer = format!("{ns}/spare");
    let e = json_of(&["explain", "node", &names.pool("idle")]);
    assert_eq!(
        (e["code"].as_str(), e["buffers"][0][0].as_str()),
        (Some("BufferPods"), Some(buffer.as_str())),
        "{e:#}"
    );
    let data = json_of(&["top", "--once"]);
    let frozen = data["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["nodepool"] == names.pool("frozen").as_str())
        .unwrap_or_else(|| panic!("{data:#}"));
    assert_eq!(
        (frozen["buffers"][0]["buffer"].as_str(), frozen["buffers"][0]["cpu"].as_f64()),
        (Some(buffer.as_str()), Some(0.5)),
        "{data:#}"
    );
    let r = json_of(&["simulate", "--from-cluster"]);
    let report = r["buffers"].as_array().unwrap().iter().find(|b| b["buffer"] == buffer.as_str()).cloned();
    assert_eq!(report.map(|b| b["onExisting"][names.pool("idle")].clone()), Some(json!(1)), "{r:#}");

    // Bad input: one line, exit 1.
    fails(&["explain", "pod", &format!("{ns}/nope")], &format!("pod \"{ns}/nope\" not found"), &[]);
    fails(&["explain", "node", "no-such-node"], "node \"no-such-node\" not found", &[]);
    fails(&["top"], "use --once", &[]);
    fails(
        &["simulate", "--from-cluster", "--remove-nodepool", "no-such-pool"],
        "nodepool \"no-such-pool\" not found",
        &[],
    );
    fails(&["simulate", "--from-cluster", "--scale", &format!("deployment/{ns}/nope=2")], "not found", &[]);
    let malformed = dir.join("malformed.yaml");
    std::fs::write(&malformed, "apiVersion: v1\nkind: Pod\nmetadata: [not, a, map\n").unwrap();
    fails(&["simulate", "--from-cluster", "-f", malformed.to_str().unwrap()], "malformed.yaml", &[]);
    let nowhere = dir.join("kubeconfig");
    std::fs::write(
        &nowhere,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    fails(
        &["explain", "node", "any"],
        "cannot reach the cluster at https://127.0.0.1:1",
        &[("KUBECONFIG", nowhere.to_str().unwrap())],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tmux` on a socket of its own.
fn tmux(args: &[&str]) -> Output {
    Command::new("tmux")
        .args(["-L", "karpenter-rs-tests"])
        .args(args)
        .output()
        .expect("tmux (hack/tools.sh installs it)")
}

fn pane(session: &str) -> String {
    String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", session]).stdout).to_string()
}

fn pending_in(screen: &str) -> Option<usize> {
    screen.lines().find_map(|l| l.strip_prefix("Pending pods: ")).and_then(|n| n.trim().parse().ok())
}

async fn eventually(what: &str, session: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let screen = pane(session);
        if check(&screen) {
            return screen;
        }
        assert!(std::time::Instant::now() < deadline, "{what}; the terminal shows:\n{screen}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn top_in_a_terminal(client: &Client, names: &Names) {
    let session = names.id.as_str();
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    let command = format!("KUBECONFIG='{kubeconfig}' exec '{}' top", env!("CARGO_BIN_EXE_karpenter"));
    let started = tmux(&["new-session", "-d", "-s", session, "-x", "220", "-y", "80", &command]);
    assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
    let header = format!("NodePool {}: 2 nodes", names.pool("open"));
    let screen =
        eventually("the NodePools drawn", session, |s| s.contains(&header) && pending_in(s).is_some()).await;
    assert!(screen.starts_with("karpenter top"), "{screen}");
    let before = pending_in(&screen).unwrap();
    let _: Pod = create(
        client,
        Some(session),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending-2"},
            "spec": {"nodeSelector": {"example.com/suite": session},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": "1"}}}]}}),
    )
    .await;
    eventually("the new pending pod counted", session, |s| pending_in(s) == Some(before + 1)).await;
    tmux(&["send-keys", "-t", session, "q"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tmux(&["has-session", "-t", session]).status.success() {
        assert!(std::time::Instant::now() < deadline, "q quits karpenter top:\n{}", pane(session));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn cleanup(client: &Client, names: &Names) {
    tmux(&["kill-session", "-t", &names.id]);
    let dp = DeleteParams::default();
    let _ = Api::<Namespace>::all(client.clone()).delete(&names.id, &dp).await;
    for what in ["open", "tainted", "limited", "zoned", "frozen", "classless"] {
        let _ = Api::<NodePool>::all(client.clone()).delete(&names.pool(what), &dp).await;
    }
    let _ = Api::<karpenter::apis::EC2NodeClass>::all(client.clone()).delete(&names.id, &dp).await;
    for what in ["dnd", "pdb", "idle"] {
        let _ = Api::<NodeClaim>::all(client.clone()).delete(&names.pool(what), &dp).await;
        let _ = Api::<Node>::all(client.clone()).delete(&names.pool(what), &dp).await;
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn explain_and_simulate_read_the_live_cluster() {
    let client = Client::try_default().await.expect("a kubeconfig for the local control plane");
    crds::install(&client, "karpenter-rs-tests", Duration::from_secs(30)).await.expect("CRDs installed");
    let names = Names { id: format!("tools-{}", std::process::id()) };
    let outcome = tokio::spawn(scenario(client.clone(), names.clone())).await;
    if std::env::var_os("KEEP").is_none() {
        cleanup(&client, &names).await;
    }
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}
