//! Host ports: two pods on one node may not bind the same port and protocol on overlapping
//! addresses.

use crate::apis::pod::Pod;

/// A host port a pod binds.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    /// Host address; empty means every address.
    pub ip: String,
    /// Port number.
    pub port: i32,
    /// `TCP` (default), `UDP` or `SCTP`.
    pub protocol: String,
}

impl HostPort {
    fn is_wildcard(&self) -> bool {
        self.ip.is_empty() || self.ip == "0.0.0.0" || self.ip == "::"
    }

    /// Whether the two bindings cannot coexist on one node.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.is_wildcard() || other.is_wildcard())
    }
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ip = if self.ip.is_empty() { "0.0.0.0" } else { &self.ip };
        write!(f, "{ip}:{}/{}", self.port, self.protocol)
    }
}

/// The host ports of every container (init containers included) of `pod`.
pub fn pod_host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = &pod.spec else { return vec![] };
    let mut out: Vec<HostPort> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|hp| *hp > 0)?;
            Some(HostPort {
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The first binding of `incoming` that conflicts with one of `used`.
pub fn first_conflict<'a>(used: &[HostPort], incoming: &'a [HostPort]) -> Option<&'a HostPort> {
    incoming.iter().find(|p| used.iter().any(|u| u.conflicts(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn hp(ip: &str, port: i32, proto: &str) -> HostPort {
        HostPort { ip: ip.into(), port, protocol: proto.into() }
    }

    #[rstest]
    #[case(hp("", 80, "TCP"), hp("10.0.0.1", 80, "TCP"), true)]
    #[case(hp("0.0.0.0", 80, "TCP"), hp("10.0.0.1", 80, "TCP"), true)]
    #[case(hp("10.0.0.2", 80, "TCP"), hp("10.0.0.1", 80, "TCP"), false)]
    #[case(hp("10.0.0.1", 80, "TCP"), hp("10.0.0.1", 80, "TCP"), true)]
    #[case(hp("", 80, "UDP"), hp("", 80, "TCP"), false)]
    #[case(hp("", 81, "TCP"), hp("", 80, "TCP"), false)]
    fn conflict_table(#[case] a: HostPort, #[case] b: HostPort, #[case] want: bool) {
        assert_eq!(a.conflicts(&b), want);
        assert_eq!(b.conflicts(&a), want);
    }
}
