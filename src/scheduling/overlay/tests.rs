use super::*;
use crate::scheduling::{Offering, Overhead, Resources};

fn overlay(yaml: &str) -> NodeOverlay {
    serde_saphyr::from_str(&format!("apiVersion: karpenter.sh/v1alpha1\nkind: NodeOverlay\n{yaml}")).unwrap()
}

fn offering(zone: &str, capacity_type: &str, price: f64) -> Offering {
    Offering::new(zone, capacity_type, price, true)
}

fn it(name: &str, cpu: &str, price: f64) -> Arc<InstanceType> {
    let mut reqs = Requirements::new();
    reqs.add("karpenter.k8s.aws/instance-cpu", Requirement::in_values([cpu]));
    let capacity = Resources::from_pairs([
        ("cpu", cpu.parse::<i64>().unwrap() * 1000),
        ("memory", 4 << 30),
        ("pods", 29),
    ]);
    Arc::new(InstanceType::new(
        name,
        reqs,
        capacity,
        Overhead::default(),
        vec![
            offering("z1", "on-demand", price),
            offering("z1", "spot", price / 2.0),
            offering("z2", "on-demand", price),
        ],
    ))
}

fn catalog() -> Vec<Arc<InstanceType>> {
    vec![it("m5.large", "2", 0.096), it("m5.xlarge", "4", 0.192), it("c5.large", "2", 0.085)]
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn run(
    overlays: &[NodeOverlay],
    pools: &[(&str, &BTreeMap<String, String>)],
) -> (Evaluation, Vec<Arc<InstanceType>>) {
    let types = catalog();
    let views: Vec<PoolTypes<'_>> =
        pools.iter().map(|(name, labels)| PoolTypes { name, labels, types: &types }).collect();
    (evaluate(overlays, &views), types)
}

fn prices(types: &[Arc<InstanceType>], name: &str) -> Vec<f64> {
    types.iter().find(|t| t.name == name).unwrap().offerings.iter().map(|o| o.price).collect()
}

#[test]
fn price_changes_parse_and_apply_as_upstream() {
    let cases = [
        ("0.25", 0.1, 0.25),
        ("+0.5", 0.1, 0.6),
        ("-0.5", 0.1, 0.0),
        ("-0.05", 0.1, 0.05),
        ("+10%", 0.2, 0.22),
        ("-15%", 0.2, 0.17),
        ("-100%", 0.2, 0.0),
        ("+.5", 1.0, 1.5),
    ];
    for (text, price, expected) in cases {
        let change = PriceChange::parse(text).unwrap_or_else(|| panic!("{text} parses"));
        assert!((change.apply(price) - expected).abs() < 1e-9, "{text} of {price}: {}", change.apply(price));
    }
    for bad in ["", "abc", "10%", "+", "1e400"] {
        assert_eq!(PriceChange::parse(bad), None, "{bad}");
    }
}

#[test]
fn a_price_overlay_changes_the_offerings_its_requirements_allow() {
    let spot = overlay(
        "metadata: {name: spot-m5}\nspec:\n  requirements:\n  - {key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}\n  - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}\n  price: \"0.01\"",
    );
    let labels = no_labels();
    let (eval, types) = run(&[spot], &[("default", &labels)]);
    assert_eq!(eval.verdicts["spot-m5"], Verdict::Applied { types: 1 });
    let applied = eval.store.apply("default", types).unwrap();
    assert_eq!(prices(&applied, "m5.large"), [0.096, 0.01, 0.096]);
    assert_eq!(prices(&applied, "c5.large"), [0.085, 0.0425, 0.085]);
    let m5 = applied.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(m5.price_overlaid() && !m5.capacity_overlaid());
    assert_eq!(m5.overlays.as_ref().unwrap().price, ["spot-m5"]);
    let c5 = applied.iter().find(|t| t.name == "c5.large").unwrap();
    assert!(c5.overlays.is_none(), "an untouched type is shared as it was");
}

#[test]
fn higher_weight_wins_the_price_and_capacity_merges() {
    // The example of upstream's documentation: overlay-b's -20% wins, capacity from both.
    let a = overlay(
        "metadata: {name: overlay-a}\nspec:\n  weight: 5\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}]\n  priceAdjustment: \"-10%\"\n  capacity: {hugepages-2Mi: 50Mi}",
    );
    let b = overlay(
        "metadata: {name: overlay-b}\nspec:\n  weight: 10\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}]\n  priceAdjustment: \"-20%\"\n  capacity: {custom-device/gpu: 1}",
    );
    let labels = no_labels();
    let (eval, types) = run(&[a, b], &[("default", &labels)]);
    assert_eq!(eval.verdicts["overlay-a"], Verdict::Applied { types: 1 });
    assert_eq!(eval.verdicts["overlay-b"], Verdict::Applied { types: 1 });
    let applied = eval.store.apply("default", types).unwrap();
    let m5 = applied.iter().find(|t| t.name == "m5.large").unwrap();
    assert!((m5.offerings[0].price - 0.096 * 0.8).abs() < 1e-9);
    assert_eq!(m5.capacity.extended.get("hugepages-2Mi"), Some(&(50 << 20)));
    assert_eq!(m5.capacity.extended.get("custom-device/gpu"), Some(&1));
    assert_eq!(m5.allocatable().extended.get("custom-device/gpu"), Some(&1), "allocatable follows");
    let marks = m5.overlays.as_ref().unwrap();
    assert_eq!(marks.price, ["overlay-b"]);
    assert_eq!(marks.capacity, ["overlay-a", "overlay-b"]);
}

#[test]
fn equal_weights_on_the_same_offering_conflict_and_the_later_name_wins() {
    let a = overlay(
        "metadata: {name: a}\nspec:\n  requirements: [{key: karpenter.k8s.aws/instance-cpu, operator: In, values: ['2']}]\n  price: \"1\"",
    );
    let b = overlay(
        "metadata: {name: b}\nspec:\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [m5.large]}]\n  price: \"2\"",
    );
    // Touches other types only: no conflict with either.
    let c = overlay(
        "metadata: {name: c}\nspec:\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [m5.xlarge]}]\n  price: \"3\"",
    );
    let labels = no_labels();
    let (eval, types) = run(&[a, b, c], &[("default", &labels)]);
    assert_eq!(eval.verdicts["b"], Verdict::Applied { types: 1 });
    assert_eq!(eval.verdicts["a"], Verdict::Conflict);
    assert_eq!(eval.verdicts["c"], Verdict::Applied { types: 1 });
    let applied = eval.store.apply("default", types).unwrap();
    assert_eq!(prices(&applied, "m5.large"), [2.0, 2.0, 2.0]);
    // The overlay in conflict applies nowhere, not even to c5.large, which b does not touch.
    assert_eq!(prices(&applied, "c5.large"), [0.085, 0.0425, 0.085]);
    assert_eq!(prices(&applied, "m5.xlarge"), [3.0, 3.0, 3.0]);
}

#[test]
fn equal_weights_adding_the_same_resource_conflict_but_different_resources_merge() {
    let a = overlay("metadata: {name: a}\nspec:\n  requirements: []\n  capacity: {example.com/fuse: 1}");
    let b = overlay("metadata: {name: b}\nspec:\n  requirements: []\n  capacity: {example.com/fuse: 2}");
    let c = overlay("metadata: {name: c}\nspec:\n  requirements: []\n  capacity: {example.com/other: 3}");
    let labels = no_labels();
    let (eval, types) = run(&[a, b, c], &[("default", &labels)]);
    assert_eq!(eval.verdicts["c"], Verdict::Applied { types: 3 });
    assert_eq!(eval.verdicts["b"], Verdict::Applied { types: 3 });
    assert_eq!(eval.verdicts["a"], Verdict::Conflict, "{:?}", eval.verdicts);
    let applied = eval.store.apply("default", types).unwrap();
    for t in &applied {
        assert_eq!(t.capacity.extended.get("example.com/fuse"), Some(&2), "{}", t.name);
        assert_eq!(t.capacity.extended.get("example.com/other"), Some(&3), "{}", t.name);
    }
}

#[test]
fn nodepool_name_and_template_labels_select_pools() {
    let by_pool = overlay(
        "metadata: {name: by-pool}\nspec:\n  requirements: [{key: karpenter.sh/nodepool, operator: In, values: [batch]}]\n  priceAdjustment: \"+1\"",
    );
    let by_label = overlay(
        "metadata: {name: by-label}\nspec:\n  weight: 2\n  requirements: [{key: team, operator: In, values: [ml]}]\n  priceAdjustment: \"+2\"",
    );
    let plain = no_labels();
    let ml: BTreeMap<String, String> = [("team".to_string(), "ml".to_string())].into();
    let (eval, types) = run(&[by_pool, by_label], &[("default", &plain), ("batch", &plain), ("ml", &ml)]);
    assert_eq!(eval.verdicts["by-pool"], Verdict::Applied { types: 3 });
    assert_eq!(eval.verdicts["by-label"], Verdict::Applied { types: 3 });
    let price = |pool: &str| prices(&eval.store.apply(pool, types.clone()).unwrap(), "c5.large")[0];
    assert!((price("default") - 0.085).abs() < 1e-9, "a label the pool lacks does not match");
    assert!((price("batch") - 1.085).abs() < 1e-9);
    assert!((price("ml") - 2.085).abs() < 1e-9);
}

#[test]
fn an_overlay_that_selects_nothing_applies_to_no_type() {
    let none = overlay(
        "metadata: {name: none}\nspec:\n  requirements: [{key: node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge]}]\n  price: \"1\"",
    );
    let labels = no_labels();
    let (eval, types) = run(&[none], &[("default", &labels)]);
    assert_eq!(eval.verdicts["none"], Verdict::Applied { types: 0 });
    let applied = eval.store.apply("default", types.clone()).unwrap();
    assert_eq!(applied, types);
}

#[test]
fn invalid_overlays_say_why_and_apply_nowhere() {
    // What the API server's schema refuses, as a client that bypasses it could still write.
    let bad = overlay(
        "metadata: {name: bad}\nspec:\n  requirements:\n  - {key: karpenter.k8s.aws/instance-cpu, operator: Gt, values: [many]}\n  - {key: team, operator: NotIn}\n  capacity: {cpu: '4', example.com/x: lots}\n  price: \"1\"\n  priceAdjustment: \"+1\"",
    );
    let labels = no_labels();
    let (eval, types) = run(&[bad], &[("default", &labels)]);
    let Verdict::Invalid(message) = &eval.verdicts["bad"] else { panic!("{:?}", eval.verdicts) };
    for part in [
        "in requirements, restricted",
        "key team with operator NotIn must have a value defined",
        "invalid capacity: cpu in resource, restricted",
        "invalid capacity: example.com/x",
        "cannot set both 'price' and 'priceAdjustment'",
    ] {
        assert!(message.contains(part), "{part} in {message}");
    }
    assert_eq!(eval.store.apply("default", types.clone()).unwrap(), types);
}

#[test]
fn a_pool_not_evaluated_awaits_evaluation() {
    let labels = no_labels();
    let (eval, types) = run(&[], &[("default", &labels)]);
    assert!(eval.store.apply("default", types.clone()).is_ok());
    let err = eval.store.apply("new", types).unwrap_err();
    assert_eq!(err.to_string(), "nodepool \"new\" is awaiting evaluation");
    assert!(OverlayStore::new().apply("default", vec![]).is_err());
}

#[test]
fn deleted_overlays_are_left_out_and_order_is_weight_then_name_descending() {
    let mut gone = overlay("metadata: {name: gone}\nspec:\n  requirements: []\n  price: \"9\"");
    gone.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let labels = no_labels();
    let (eval, types) = run(std::slice::from_ref(&gone), &[("default", &labels)]);
    assert!(eval.verdicts.is_empty());
    assert_eq!(eval.store.apply("default", types.clone()).unwrap(), types);

    let o = |name: &str, weight: Option<i32>| {
        let w = weight.map(|w| format!("\n  weight: {w}")).unwrap_or_default();
        overlay(&format!("metadata: {{name: {name}}}\nspec:\n  requirements: []{w}"))
    };
    let all = [o("a", None), o("b", Some(3)), o("c", None), o("d", Some(3))];
    let names: Vec<&str> = order(&all).iter().map(|o| o.metadata.name.as_deref().unwrap()).collect();
    assert_eq!(names, ["d", "b", "c", "a"]);
}
