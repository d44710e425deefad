//! The pods' cluster as Envoy last reported it, by kvroute instance (filter name): written by
//! the load-balancing policy ([`crate::balancer`]) on each membership update, handed to the
//! instance's `[discovery] source = "envoy"` feed. Envoy creates the policy before the filter,
//! so the latest list is kept here and given to an instance when it starts.

use std::collections::HashMap;
use std::sync::LazyLock;

use kvroute_ext_proc::discovery::envoy::EnvoyHost;
use parking_lot::Mutex;

use crate::instance::Instance;

static LATEST: LazyLock<Mutex<HashMap<String, Vec<EnvoyHost>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Records `hosts` for instance `filter_name` and gives them to it if it runs.
pub fn publish(filter_name: &str, hosts: Vec<EnvoyHost>) {
    // Not held while the instance registry is locked (no lock-order cycle with `replay`).
    LATEST.lock().insert(filter_name.to_owned(), hosts.clone());
    if let Some(feed) = Instance::find(filter_name).and_then(|i| i.envoy_feed.clone()) {
        feed.publish(hosts);
    }
}

/// The last hosts published for `filter_name`.
pub fn latest(filter_name: &str) -> Option<Vec<EnvoyHost>> {
    LATEST.lock().get(filter_name).cloned()
}

/// Gives a starting instance the hosts published before it existed.
pub(crate) fn replay(filter_name: &str, instance: &Instance) {
    if let (Some(feed), Some(hosts)) = (&instance.envoy_feed, latest(filter_name)) {
        feed.publish(hosts);
    }
}
