//! kvroute as the load-balancing policy of the pods' cluster
//! (`envoy.load_balancing_policies.dynamic_modules`), so that Envoy's own fleet knowledge
//! decides which hosts exist and which may take requests: the hosts of an EDS, DNS or static
//! cluster, Envoy's active health checks and outlier detection.
//!
//! - **Membership**: on every membership or health update Envoy gives each thread's balancer,
//!   the cluster's hosts (all priorities) and whether each is healthy are published to the
//!   kvroute instance named by the policy's configuration ([`crate::fleet`]), whose
//!   `[discovery] source = "envoy"` makes them its pods (a host Envoy takes out is an unready
//!   pod: kvroute does not pick it).
//! - **Choice**: the filter has already decided; it named the pod in the request's
//!   `x-gateway-destination-endpoint` header. The balancer answers that host's index among
//!   Envoy's healthy hosts. When the header names a host Envoy no longer counts healthy
//!   (kvroute has not seen the update yet), it answers the next healthy host in turn, as round
//!   robin would; with no healthy host, or no header (the filter did not decide: the routed
//!   route takes every request of the routed paths), none (Envoy's 503
//!   `no_healthy_upstream`), never a pod kvroute did not choose.
//!   The in-flight ticket stays with the filter, released exactly once at the stream's end.

use std::collections::HashMap;

use kvroute_ext_proc::discovery::envoy::EnvoyHost;

/// The request header that names the pod the filter chose.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// What a balancer reads of Envoy's cluster during a membership update.
pub trait ClusterView {
    /// Priorities in the cluster.
    fn priorities(&self) -> u32;
    /// Every host at `priority`: its `ip:port` and whether Envoy counts it healthy.
    fn hosts(&self, priority: u32) -> Vec<(String, bool)>;
    /// The healthy hosts at `priority`, in Envoy's order (the order `choose` indexes).
    fn healthy_hosts(&self, priority: u32) -> Vec<String>;
}

/// The policy's configuration: the kvroute instance (the filter's `filter_name`) it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalancerConfig {
    /// The filter name.
    pub filter_name: String,
}

impl BalancerConfig {
    /// From `lb_policy_config` (a `StringValue`): the filter name, trimmed; `kvroute` (the
    /// shipped filter name) when empty.
    pub fn parse(config: &[u8]) -> Result<BalancerConfig, String> {
        let text = std::str::from_utf8(config)
            .map_err(|_| "lb_policy_config is not UTF-8".to_owned())?
            .trim();
        let name = if text.is_empty() { "kvroute" } else { text };
        if name.contains(char::is_whitespace) {
            return Err(format!(
                "lb_policy_config {name:?} must be the kvroute filter's filter_name"
            ));
        }
        Ok(BalancerConfig {
            filter_name: name.to_owned(),
        })
    }
}

/// One thread's balancer.
#[derive(Debug)]
pub struct Balancer {
    filter_name: String,
    /// Healthy host address → (priority, index among that priority's healthy hosts).
    by_address: HashMap<String, (u32, u32)>,
    /// Every healthy host, for the fallback.
    order: Vec<(u32, u32)>,
    next: usize,
}

impl Balancer {
    /// A balancer for `config`'s instance, with no host until the first membership update.
    pub fn new(config: &BalancerConfig) -> Balancer {
        Balancer {
            filter_name: config.filter_name.clone(),
            by_address: HashMap::new(),
            order: Vec::new(),
            next: 0,
        }
    }

    /// Reads the cluster again and publishes its hosts (see the module docs).
    pub fn on_membership_update(&mut self, cluster: &impl ClusterView) {
        self.by_address.clear();
        self.order.clear();
        let mut hosts = Vec::new();
        for priority in 0..cluster.priorities() {
            for (i, address) in cluster.healthy_hosts(priority).into_iter().enumerate() {
                let at = (priority, i as u32);
                self.order.push(at);
                self.by_address.entry(address).or_insert(at);
            }
            for (address, healthy) in cluster.hosts(priority) {
                hosts.push(EnvoyHost { address, healthy });
            }
        }
        crate::fleet::publish(&self.filter_name, hosts);
    }

    /// The host for a request whose `x-gateway-destination-endpoint` is `destination`.
    pub fn choose(&mut self, destination: Option<&[u8]>) -> Option<(u32, u32)> {
        // No decision: none (the route goes to this cluster whatever the filter did).
        let destination = std::str::from_utf8(destination?).ok()?.trim();
        let named = self.by_address.get(destination).copied();
        if named.is_some() {
            return named;
        }
        if self.order.is_empty() {
            return None;
        }
        let at = self.order[self.next % self.order.len()];
        self.next = self.next.wrapping_add(1);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(Vec<Vec<(String, bool)>>);

    impl ClusterView for Fake {
        fn priorities(&self) -> u32 {
            self.0.len() as u32
        }
        fn hosts(&self, priority: u32) -> Vec<(String, bool)> {
            self.0[priority as usize].clone()
        }
        fn healthy_hosts(&self, priority: u32) -> Vec<String> {
            self.0[priority as usize]
                .iter()
                .filter(|h| h.1)
                .map(|h| h.0.clone())
                .collect()
        }
    }

    fn host(a: &str, healthy: bool) -> (String, bool) {
        (a.to_owned(), healthy)
    }

    #[test]
    fn the_named_healthy_host_is_chosen_else_the_next_in_turn() {
        let config = BalancerConfig::parse(b" balancer-test \n").unwrap();
        assert_eq!(config.filter_name, "balancer-test");
        let mut b = Balancer::new(&config);
        assert_eq!(b.choose(Some(b"10.0.0.1:80")), None, "no host yet");
        b.on_membership_update(&Fake(vec![
            vec![host("10.0.0.1:80", true), host("10.0.0.2:80", false)],
            vec![host("10.0.0.3:80", true)],
        ]));
        assert_eq!(b.choose(Some(b"10.0.0.1:80")), Some((0, 0)));
        assert_eq!(b.choose(Some(b"10.0.0.3:80")), Some((1, 0)));
        // Unhealthy or unknown (kvroute has not seen Envoy's update yet): the healthy hosts
        // in turn.
        assert_eq!(b.choose(Some(b"10.0.0.2:80")), Some((0, 0)));
        assert_eq!(b.choose(Some(b"10.0.0.9:80")), Some((1, 0)));
        // No decision (no header, or not one the filter writes): no host, Envoy's 503, never
        // a pod kvroute did not choose.
        assert_eq!(b.choose(None), None);
        assert_eq!(b.choose(Some(b"\xff")), None);
        // What was published: every host with its health.
        let published = crate::fleet::latest("balancer-test").unwrap();
        assert_eq!(published.len(), 3);
        assert!(published
            .iter()
            .any(|h| h.address == "10.0.0.2:80" && !h.healthy));
        b.on_membership_update(&Fake(vec![vec![host("10.0.0.1:80", false)]]));
        assert_eq!(
            b.choose(Some(b"10.0.0.1:80")),
            None,
            "no healthy host: Envoy's 503"
        );
    }

    #[test]
    fn the_config_names_the_filter() {
        assert_eq!(BalancerConfig::parse(b"").unwrap().filter_name, "kvroute");
        assert!(BalancerConfig::parse(b"a b").is_err());
        assert!(BalancerConfig::parse(b"\xff").is_err());
    }
}
