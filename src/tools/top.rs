//! `karpenter top`: the nodes grouped by NodePool with their CPU and memory requests against
//! allocatable, instance type, capacity type, price and age, flagged when drifted, blocked from
//! disruption or being disrupted; totals per NodePool and for the cluster ($/h and $/month); the
//! pending pods. In a terminal it keeps the controller's caches running and redraws every second
//! (`q` or Esc quits, arrows and PageUp/PageDown scroll); `--once` prints one frame and exits.
//!
//! [`view`] (pure) makes the frame's figures from a snapshot; [`render`] lays them out as lines of
//! text, which the terminal view and `--once` both print.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Text};
use ratatui::widgets::Paragraph;
use serde::Serialize;

use crate::apis::common::ConditionStatus;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodeclaim::conditions::DRIFTED;
use crate::disruption::candidates;
use crate::state::snapshot::Snapshot;
use crate::state::statenode::state_nodes;
use crate::state::{StateNode, buffers, pods};
use crate::tools::simulate::report::push_table;

use super::Live;

/// Hours in a month, for $/month (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;
/// The group of nodes no NodePool owns.
pub const UNMANAGED: &str = "(not managed by Karpenter)";

/// One node's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// The Node's name (the NodeClaim's before it registers).
    pub name: String,
    /// Instance type.
    pub instance_type: String,
    /// `spot`, `on-demand`, `reserved`.
    pub capacity_type: String,
    /// Zone.
    pub zone: String,
    /// $/h, when known: the node's full cost (see the README's "What a node costs").
    pub price_per_hour: Option<f64>,
    /// $/h at list price, when known.
    pub list_price_per_hour: Option<f64>,
    /// Seconds since it was created.
    pub age_seconds: i64,
    /// CPU requested by its pods (cores) and allocatable.
    pub cpu: (f64, f64),
    /// Memory requested by its pods (bytes) and allocatable.
    pub memory: (f64, f64),
    /// Pods bound to it.
    pub pods: usize,
    /// `drifted`, `blocked` (not a disruption candidate: do-not-disrupt, PDB...), `buffer` (it
    /// keeps a CapacityBuffer's headroom), `disrupting`
    /// (being replaced or deleted), `not-ready`, `launching`.
    pub flags: Vec<&'static str>,
}

/// Totals of a group of nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Nodes.
    pub nodes: usize,
    /// $/h of those with a known price.
    pub price_per_hour: f64,
    /// $/h at list price of those with a known price.
    pub list_price_per_hour: f64,
    /// CPU requested and allocatable (cores).
    pub cpu: (f64, f64),
    /// Memory requested and allocatable (bytes).
    pub memory: (f64, f64),
}

impl Totals {
    fn add(&mut self, row: &NodeRow) {
        self.nodes += 1;
        self.price_per_hour += row.price_per_hour.unwrap_or(0.0);
        self.list_price_per_hour += row.list_price_per_hour.unwrap_or(0.0);
        self.cpu = (self.cpu.0 + row.cpu.0, self.cpu.1 + row.cpu.1);
        self.memory = (self.memory.0 + row.memory.0, self.memory.1 + row.memory.1);
    }
}

/// A NodePool's nodes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// The NodePool ([`UNMANAGED`] for the rest).
    pub nodepool: String,
    /// Its totals.
    pub totals: Totals,
    /// The headroom CapacityBuffers keep on its nodes, by buffer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<Headroom>,
    /// Its nodes, by name.
    pub nodes: Vec<NodeRow>,
}

/// The headroom one CapacityBuffer keeps on a NodePool's nodes: room for its placeholders.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Headroom {
    /// The buffer, `namespace/name`.
    pub buffer: String,
    /// Placeholders on the NodePool's nodes.
    pub placeholders: usize,
    /// Nodes holding them.
    pub nodes: usize,
    /// CPU they keep free (cores).
    pub cpu: f64,
    /// Memory they keep free (bytes).
    pub memory: f64,
}

/// A CapacityBuffer whose placeholders do not all fit on existing capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unplaced {
    /// The buffer, `namespace/name`.
    pub buffer: String,
    /// Placeholders waiting for new NodeClaims.
    pub needing_new_capacity: usize,
    /// Placeholders no NodePool can hold, and why the first cannot.
    pub fitting_nowhere: usize,
    /// Why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One frame.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    /// When.
    pub at: Timestamp,
    /// The cluster's totals.
    pub cluster: Totals,
    /// Pods waiting for capacity (reported unschedulable, not bound).
    pub pending_pods: usize,
    /// CapacityBuffers whose placeholders do not all fit on existing capacity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unplaced_buffers: Vec<Unplaced>,
    /// By NodePool name; the unmanaged nodes last.
    pub groups: Vec<Group>,
}

fn flags(
    node: &StateNode,
    pools: &BTreeSet<String>,
    snapshot: &Snapshot,
    now: Timestamp,
) -> Vec<&'static str> {
    let mut out = Vec::new();
    let claim = node.claim.as_deref();
    let conditions =
        claim.and_then(|c| c.status.as_ref()).map(|s| s.conditions.as_slice()).unwrap_or_default();
    if conditions.iter().any(|c| c.type_ == DRIFTED && c.status == ConditionStatus::True) {
        out.push("drifted");
    }
    let tainted = node.taints.iter().any(|t| t.key == TAINT_DISRUPTED);
    let deleting = claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some())
        || node.node.as_ref().is_some_and(|n| n.metadata.deletion_timestamp.is_some());
    if node.marked_for_deletion || tainted || deleting {
        out.push("disrupting");
    } else if node.managed && node.initialized {
        let verdict = candidates::check(node, pools, &snapshot.pdbs, false, now);
        if verdict.blocked.is_some() {
            out.push("blocked");
        }
    }
    if snapshot.buffers_placed.holds(node) {
        out.push("buffer");
    }
    if node.node.is_none() {
        out.push("launching");
    } else if !node.is_ready() {
        out.push("not-ready");
    }
    out
}

/// The frame of `snapshot` (with instance types, for prices) at `now`.
pub fn view(snapshot: &Snapshot, now: Timestamp) -> View {
    let nodes = state_nodes(snapshot);
    let pools: BTreeSet<String> = snapshot.live_nodepools().filter_map(|p| p.metadata.name.clone()).collect();
    let mut groups: BTreeMap<(bool, String), Group> = BTreeMap::new();
    let mut cluster = Totals::default();
    for node in &nodes {
        let created = node
            .node
            .as_ref()
            .and_then(|n| n.metadata.creation_timestamp.as_ref())
            .or_else(|| node.claim.as_ref().and_then(|c| c.metadata.creation_timestamp.as_ref()));
        let row = NodeRow {
            name: node.name.clone(),
            instance_type: node.instance_type().unwrap_or("-").to_string(),
            capacity_type: node.capacity_type().unwrap_or("-").to_string(),
            zone: node.zone().unwrap_or("-").to_string(),
            price_per_hour: node.price,
            list_price_per_hour: node.list_price,
            age_seconds: created.map(|t| now.duration_since(t.0).as_secs().max(0)).unwrap_or(0),
            cpu: (node.pod_requests.get("cpu") as f64 / 1000.0, node.allocatable.get("cpu") as f64 / 1000.0),
            memory: (node.pod_requests.get("memory") as f64, node.allocatable.get("memory") as f64),
            pods: node.pods.len(),
            flags: flags(node, &pools, snapshot, now),
        };
        cluster.add(&row);
        let key = match node.nodepool() {
            Some(pool) if node.managed => (false, pool.to_string()),
            _ => (true, UNMANAGED.to_string()),
        };
        let group = groups.entry(key.clone()).or_insert_with(|| Group {
            nodepool: key.1.clone(),
            totals: Totals::default(),
            buffers: Vec::new(),
            nodes: Vec::new(),
        });
        group.totals.add(&row);
        group.nodes.push(row);
    }
    // NodePools without nodes show too.
    for pool in &pools {
        groups.entry((false, pool.clone())).or_insert_with(|| Group {
            nodepool: pool.clone(),
            totals: Totals::default(),
            buffers: Vec::new(),
            nodes: Vec::new(),
        });
    }
    for ((unmanaged, pool), headroom) in headroom(snapshot, &nodes) {
        if let Some(group) = groups.get_mut(&(unmanaged, pool)) {
            group.buffers = headroom;
        }
    }
    let unplaced_buffers = snapshot
        .buffers_placed
        .placements
        .iter()
        .filter(|(_, p)| p.needing_new() > 0 || p.failed > 0)
        .map(|(buffer, p)| Unplaced {
            buffer: buffer.clone(),
            needing_new_capacity: p.needing_new(),
            fitting_nowhere: p.failed,
            reason: p.error.clone(),
        })
        .collect();
    let pending_pods = snapshot.pods.iter().filter(|p| pods::is_provisionable(p)).count();
    View { at: now, cluster, pending_pods, unplaced_buffers, groups: groups.into_values().collect() }
}

/// The headroom each CapacityBuffer keeps, by the group of the nodes holding it.
fn headroom(snapshot: &Snapshot, nodes: &[StateNode]) -> BTreeMap<(bool, String), Vec<Headroom>> {
    // One placeholder's requests, per buffer.
    let mut chunk: BTreeMap<String, crate::scheduling::Resources> = BTreeMap::new();
    for pod in &snapshot.virtual_pods {
        if let Some(key) = buffers::buffer_of(pod) {
            chunk.entry(key).or_insert_with(|| crate::scheduling::resources::pod_requests(pod));
        }
    }
    let group_of = |host: &str| {
        let node = nodes.iter().find(|n| n.name == host || n.claim_name() == Some(host))?;
        Some(match node.nodepool() {
            Some(pool) if node.managed => (false, pool.to_string()),
            _ => (true, UNMANAGED.to_string()),
        })
    };
    let mut out: BTreeMap<(bool, String), Vec<Headroom>> = BTreeMap::new();
    for (buffer, placement) in &snapshot.buffers_placed.placements {
        let mut by_group: BTreeMap<(bool, String), Headroom> = BTreeMap::new();
        for (host, count) in &placement.existing {
            let Some(group) = group_of(host) else { continue };
            let requests = chunk.get(buffer).cloned().unwrap_or_default();
            let h = by_group.entry(group).or_insert_with(|| Headroom {
                buffer: buffer.clone(),
                placeholders: 0,
                nodes: 0,
                cpu: 0.0,
                memory: 0.0,
            });
            h.placeholders += count;
            h.nodes += 1;
            h.cpu += (requests.get("cpu") * *count as i64) as f64 / 1000.0;
            h.memory += (requests.get("memory") * *count as i64) as f64;
        }
        for (group, h) in by_group {
            out.entry(group).or_default().push(h);
        }
    }
    out
}

/// `1.5`, `750m`-style CPU; `3.2Gi`-style memory.
fn cpu(cores: f64) -> String {
    if cores.fract() == 0.0 { format!("{cores:.0}") } else { format!("{cores:.2}") }
}

fn memory(bytes: f64) -> String {
    const GI: f64 = (1u64 << 30) as f64;
    const MI: f64 = (1u64 << 20) as f64;
    if bytes == 0.0 {
        "0".to_string()
    } else if bytes >= GI {
        format!("{:.1}Gi", bytes / GI)
    } else {
        format!("{:.0}Mi", bytes / MI)
    }
}

/// `[#####.....]  52%` for `used` of `total`.
pub fn bar(used: f64, total: f64, width: usize) -> String {
    let share = if total > 0.0 { (used / total).clamp(0.0, 1.0) } else { 0.0 };
    let filled = (share * width as f64).round() as usize;
    format!("[{}{}] {:>3.0}%", "#".repeat(filled), ".".repeat(width - filled), share * 100.0)
}

fn age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn money(per_hour: f64) -> String {
    format!("${per_hour:.4}/h (${:.2}/month)", per_hour * HOURS_PER_MONTH)
}

/// The totals' cost, and their list price when what comes with the nodes adds to it.
fn with_list_price(t: &Totals) -> String {
    if (t.price_per_hour - t.list_price_per_hour).abs() < 5e-5 {
        return money(t.price_per_hour);
    }
    format!("{} (list ${:.4}/h)", money(t.price_per_hour), t.list_price_per_hour)
}

fn totals_line(t: &Totals) -> String {
    if t.nodes == 0 {
        return "no nodes".to_string();
    }
    format!(
        "{} node{}, {}, CPU {}/{} {}, memory {}/{} {}",
        t.nodes,
        if t.nodes == 1 { "" } else { "s" },
        with_list_price(t),
        cpu(t.cpu.0),
        cpu(t.cpu.1),
        bar(t.cpu.0, t.cpu.1, 10),
        memory(t.memory.0),
        memory(t.memory.1),
        bar(t.memory.0, t.memory.1, 10),
    )
}

/// The frame as lines of text: a header, then each NodePool's totals and node table.
pub fn render(view: &View) -> Vec<String> {
    let mut out = vec![
        format!("karpenter top  {}", view.at.round(k8s_openapi::jiff::Unit::Second).unwrap_or(view.at)),
        format!("Cluster: {}", totals_line(&view.cluster)),
        format!("Pending pods: {}", view.pending_pods),
    ];
    for u in &view.unplaced_buffers {
        let mut line = format!("CapacityBuffer {}:", u.buffer);
        if u.needing_new_capacity > 0 {
            line.push_str(&format!(" {} placeholder(s) waiting for new capacity", u.needing_new_capacity));
        }
        if u.fitting_nowhere > 0 {
            let why = u.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            line.push_str(&format!(" {} placeholder(s) fit nowhere{why}", u.fitting_nowhere));
        }
        out.push(line);
    }
    for group in &view.groups {
        out.push(String::new());
        out.push(format!("NodePool {}: {}", group.nodepool, totals_line(&group.totals)));
        for h in &group.buffers {
            out.push(format!(
                "  Buffer headroom {}: {} placeholder{} on {} node{}, CPU {}, memory {}",
                h.buffer,
                h.placeholders,
                if h.placeholders == 1 { "" } else { "s" },
                h.nodes,
                if h.nodes == 1 { "" } else { "s" },
                cpu(h.cpu),
                memory(h.memory),
            ));
        }
        if group.nodes.is_empty() {
            continue;
        }
        let mut rows = vec![
            ["NODE", "INSTANCE-TYPE", "CAPACITY", "ZONE", "$/H", "AGE", "PODS", "CPU", "MEMORY", "FLAGS"]
                .map(String::from)
                .to_vec(),
        ];
        for n in &group.nodes {
            rows.push(vec![
                n.name.clone(),
                n.instance_type.clone(),
                n.capacity_type.clone(),
                n.zone.clone(),
                n.price_per_hour.map(|p| format!("{p:.4}")).unwrap_or_else(|| "-".into()),
                age(n.age_seconds),
                n.pods.to_string(),
                bar(n.cpu.0, n.cpu.1, 10),
                bar(n.memory.0, n.memory.1, 10),
                n.flags.join(","),
            ]);
        }
        let mut table = String::new();
        push_table(&mut table, &rows);
        out.extend(table.lines().map(|l| format!("  {l}")));
    }
    out
}

/// Runs the terminal view until `q`, Esc or Ctrl-C; redraws every `refresh`.
pub fn interactive(live: &Live, refresh: Duration) -> io::Result<()> {
    // A failure half-way (raw mode on, no alternate screen) must still give the terminal back.
    let mut terminal = ratatui::try_init().inspect_err(|_| ratatui::restore())?;
    let result = (|| -> io::Result<()> {
        let mut scroll: u16 = 0;
        let mut lines = render(&view(&live.snapshot(), Timestamp::now()));
        let mut drawn = Instant::now();
        loop {
            terminal.draw(|frame| {
                let text: Vec<Line> = lines
                    .iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let bold = i == 0 || l.starts_with("NodePool ") || l.starts_with("Cluster:");
                        if bold {
                            Line::styled(l.clone(), Style::default().add_modifier(Modifier::BOLD))
                        } else {
                            Line::raw(l.clone())
                        }
                    })
                    .collect();
                frame.render_widget(Paragraph::new(Text::from(text)).scroll((scroll, 0)), frame.area());
            })?;
            let wait = refresh.saturating_sub(drawn.elapsed());
            if event::poll(wait)?
                && let Event::Key(key) = event::read()?
                && key.kind == KeyEventKind::Press
            {
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                    KeyCode::Down | KeyCode::Char('j') => scroll = scroll.saturating_add(1),
                    KeyCode::Up | KeyCode::Char('k') => scroll = scroll.saturating_sub(1),
                    KeyCode::PageDown => scroll = scroll.saturating_add(20),
                    KeyCode::PageUp => scroll = scroll.saturating_sub(20),
                    KeyCode::Home => scroll = 0,
                    _ => {}
                }
            }
            if drawn.elapsed() >= refresh {
                lines = render(&view(&live.snapshot(), Timestamp::now()));
                drawn = Instant::now();
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::disruption::tests::{Cluster, NOW, consolidating, obj, pool};

    #[test]
    fn nodes_are_grouped_by_nodepool_with_totals_and_flags() {
        let mut c = Cluster::new(vec![
            pool("p", consolidating("100%"), &["on-demand"]),
            pool("idle", consolidating("1"), &["spot"]),
        ]);
        c.node("a", "p", "large", "on-demand", json!({}))
            .pod("w", "a", "1", json!({"karpenter.sh/do-not-disrupt": "true"}))
            .node("b", "p", "small", "on-demand", json!({}))
            .drifted("b", "2026-11-24T11:00:00Z", None);
        let mut snapshot = c.snapshot();
        snapshot.nodes.push(obj(json!({"metadata": {"name": "system", "labels": {}},
            "status": {"allocatable": {"cpu": "2"}, "conditions": [{"type": "Ready", "status": "True"}]}})));
        snapshot.pods.push(obj(json!({"metadata": {"name": "waiting", "namespace": "ns"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}})));
        let v = view(&snapshot, NOW.parse().unwrap());
        let names: Vec<&str> = v.groups.iter().map(|g| g.nodepool.as_str()).collect();
        assert_eq!(names, ["idle", "p", UNMANAGED], "NodePools by name, unmanaged last, empty pools shown");
        let p = &v.groups[1];
        assert_eq!(p.totals.nodes, 2);
        assert!((p.totals.price_per_hour - 0.50).abs() < 1e-9);
        assert_eq!(p.nodes[0].flags, ["blocked"], "a do-not-disrupt pod blocks a");
        assert_eq!(p.nodes[1].flags, ["drifted"]);
        assert_eq!(p.nodes[0].cpu, (1.0, 4.0));
        assert_eq!(v.cluster.nodes, 3);
        assert_eq!(v.pending_pods, 1);

        let lines = render(&v);
        let text = lines.join("\n");
        assert!(text.contains("Cluster: 3 nodes, $0.5000/h ($365.00/month)"), "{text}");
        assert!(text.contains("Pending pods: 1"), "{text}");
        assert!(
            text.contains("NodePool p: 2 nodes, $0.5000/h ($365.00/month), CPU 1/6 [##........]  17%"),
            "{text}"
        );
        let a = lines.iter().find(|l| l.trim_start().starts_with("a ")).unwrap();
        assert!(
            a.contains("large")
                && a.contains("0.4000")
                && a.contains("[###.......]  25%")
                && a.ends_with("blocked"),
            "{a}"
        );
    }

    #[test]
    fn buffer_headroom_shows_under_the_nodepool_that_keeps_it() {
        let mut c = Cluster::new(vec![pool("p", consolidating("100%"), &["on-demand"])]);
        c.node("a", "p", "large", "on-demand", json!({})).pod("w", "a", "1", json!({}));
        let mut snapshot = c.snapshot();
        let buffer = |name: &str| -> crate::apis::CapacityBuffer {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "uid": name},
                "spec": {"replicas": 2}}))
            .unwrap()
        };
        let template = |cpu: &str| -> k8s_openapi::api::core::v1::PodTemplateSpec {
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu}}}]}}))
            .unwrap()
        };
        snapshot.virtual_pods = buffers::virtual_pods(&buffer("spare"), &template("1"), 2);
        snapshot.virtual_pods.extend(buffers::virtual_pods(&buffer("huge"), &template("640"), 1));
        let snapshot = crate::tools::with_buffers_placed(snapshot);
        let v = view(&snapshot, NOW.parse().unwrap());
        let p = v.groups.iter().find(|g| g.nodepool == "p").unwrap();
        assert_eq!(p.buffers.len(), 1, "{:?}", snapshot.buffers_placed);
        let h = &p.buffers[0];
        assert_eq!((h.buffer.as_str(), h.placeholders, h.nodes, h.cpu), ("ns/spare", 2, 1, 2.0));
        assert!(p.nodes[0].flags.contains(&"buffer"), "{:?}", p.nodes[0].flags);
        assert_eq!(v.unplaced_buffers.len(), 1);
        assert_eq!(
            (v.unplaced_buffers[0].buffer.as_str(), v.unplaced_buffers[0].fitting_nowhere),
            ("ns/huge", 1)
        );

        let text = render(&v).join("\n");
        assert!(
            text.contains("  Buffer headroom ns/spare: 2 placeholders on 1 node, CPU 2, memory 0"),
            "{text}"
        );
        assert!(text.contains("CapacityBuffer ns/huge: 1 placeholder(s) fit nowhere ("), "{text}");
    }

    #[test]
    fn bars_and_ages_read_well() {
        assert_eq!(bar(1.0, 4.0, 4), "[#...]  25%");
        assert_eq!(bar(5.0, 4.0, 4), "[####] 100%");
        assert_eq!(bar(1.0, 0.0, 4), "[....]   0%");
        assert_eq!(
            (age(59), age(600), age(3 * 3600), age(3 * 86400)),
            ("59s".into(), "10m".into(), "3h".into(), "3d".into())
        );
    }
}
