//! Renders `envoy/envoy.module.template.yaml`: Envoy with kvroute inside it (the dynamic module
//! `libkvroute_envoy.so`, crate `kvroute-envoy`) for a kvroute [`Config`]: Envoy's listener and
//! admin addresses, the buffer limit, kvroute's body limit (in Envoy's own 413 message), the
//! filter's configuration (the path of kvroute's TOML file, or its text), and the pods'
//! cluster ([`PodsCluster`]): `ORIGINAL_DST` when kvroute finds the pods itself, or Envoy's
//! own hosts, health checks and outlier detection with kvroute as the load-balancing policy
//! when the configuration says `[discovery] source = "envoy"`.

use std::net::SocketAddr;

use crate::config::Config;

/// The template, shipped in `envoy/`.
pub const TEMPLATE: &str = include_str!("../../envoy/envoy.module.template.yaml");
/// The pods' cluster when kvroute finds the pods: `ORIGINAL_DST` on the filter's metadata.
pub const ORIGINAL_DST_CLUSTER: &str =
    include_str!("../../envoy/module-clusters/original_dst.yaml");
/// The pods' cluster when Envoy knows them, with kvroute as its load-balancing policy.
pub const ENVOY_FLEET_CLUSTER: &str = include_str!("../../envoy/module-clusters/envoy_fleet.yaml");

/// Where the pods' cluster gets its hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodsCluster {
    /// kvroute finds the pods (static list, Kubernetes): `ORIGINAL_DST`.
    OriginalDst,
    /// Envoy's `STATIC` endpoints.
    Static(Vec<SocketAddr>),
    /// Envoy's `STRICT_DNS` endpoints: every address a name resolves to (a Kubernetes
    /// headless Service), at a port.
    Dns {
        /// The name.
        host: String,
        /// The port.
        port: u16,
    },
}

impl PodsCluster {
    /// Parses `static:IP:PORT[,IP:PORT...]` or `dns:HOST:PORT` (`--pods`).
    pub fn parse(text: &str) -> Result<PodsCluster, String> {
        if let Some(list) = text.strip_prefix("static:") {
            let addrs = list
                .split(',')
                .map(|a| {
                    a.trim()
                        .parse::<SocketAddr>()
                        .map_err(|_| format!("{a:?} is not ip:port"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(PodsCluster::Static(addrs));
        }
        if let Some(hp) = text.strip_prefix("dns:") {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| format!("{hp:?} is not HOST:PORT"))?;
            let port = port
                .parse()
                .map_err(|_| format!("{port:?} is not a port"))?;
            if host.is_empty() {
                return Err("empty host name".into());
            }
            return Ok(PodsCluster::Dns {
                host: host.to_owned(),
                port,
            });
        }
        Err(format!(
            "{text:?}: expected static:IP:PORT[,IP:PORT...] or dns:HOST:PORT"
        ))
    }

    /// The cluster's YAML (at the template's indentation).
    fn yaml(&self) -> String {
        let endpoint = |host: &str, port: u16| {
            format!(
                "\n        - endpoint: {{ address: {{ socket_address: {{ address: {host}, port_value: {port} }} }} }}"
            )
        };
        let (kind, endpoints) = match self {
            PodsCluster::OriginalDst => return ORIGINAL_DST_CLUSTER.to_owned(),
            PodsCluster::Static(addrs) => (
                "STATIC",
                addrs
                    .iter()
                    .map(|a| endpoint(&a.ip().to_string(), a.port()))
                    .collect::<String>(),
            ),
            PodsCluster::Dns { host, port } => ("STRICT_DNS", endpoint(host, *port)),
        };
        ENVOY_FLEET_CLUSTER
            .replace("__PODS_TYPE__", kind)
            .replace("__PODS_ENDPOINTS__", &endpoints)
    }
}

/// How the filter gets kvroute's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterConfig {
    /// The path of the TOML file, as Envoy's process sees it: the module reads it at start and
    /// again whenever it changes.
    Path(String),
    /// The TOML text itself, inside Envoy's configuration: applied again when Envoy loads a new
    /// configuration of the listener.
    Inline(String),
}

/// Envoy-side settings that are not in the kvroute configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleOptions {
    /// Where Envoy listens for clients.
    pub listen: SocketAddr,
    /// Envoy's admin address.
    pub admin: SocketAddr,
    /// The filter's configuration.
    pub filter_config: FilterConfig,
    /// The pods' cluster.
    pub pods: PodsCluster,
}

/// Why a configuration and a pods' cluster do not go together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// `[discovery] source = "envoy"` needs Envoy to know the hosts.
    #[error("[discovery] source = \"envoy\" needs the pods' cluster: --pods static:IP:PORT,... or --pods dns:HOST:PORT")]
    NoPods,
    /// Envoy's hosts are used only when kvroute takes its pods from Envoy.
    #[error("--pods gives Envoy the hosts, but kvroute finds its own pods: set [discovery] source = \"envoy\" ([discovery.envoy] model = ...) in the configuration")]
    PodsWithoutEnvoyDiscovery,
}

/// The filter_config value, as YAML at the template's indentation: a quoted path, or a block
/// scalar holding the TOML.
fn filter_config_yaml(fc: &FilterConfig) -> String {
    match fc {
        // A JSON string is a YAML double-quoted scalar.
        FilterConfig::Path(p) => format!("{p:?}"),
        FilterConfig::Inline(text) => {
            let mut s = String::from("|");
            for line in text.lines() {
                s.push('\n');
                if !line.is_empty() {
                    s.push_str("                  ");
                    s.push_str(line);
                }
            }
            s
        }
    }
}

/// The Envoy YAML, after [`check`].
pub fn render(config: &Config, opts: &ModuleOptions) -> String {
    let ip = |a: SocketAddr| a.ip().to_string();
    TEMPLATE
        .replace("__PODS_CLUSTER__\n", &opts.pods.yaml())
        .replace("__ADMIN_ADDRESS__", &ip(opts.admin))
        .replace("__ADMIN_PORT__", &opts.admin.port().to_string())
        .replace("__LISTEN_ADDRESS__", &ip(opts.listen))
        .replace("__LISTEN_PORT__", &opts.listen.port().to_string())
        .replace(
            "__BUFFER_LIMIT__",
            &config.max_body_bytes.saturating_mul(2).to_string(),
        )
        .replace("__MAX_BODY_BYTES__", &config.max_body_bytes.to_string())
        .replace(
            "__FILTER_CONFIG__",
            &filter_config_yaml(&opts.filter_config),
        )
}

/// Whether the pods' cluster fits the configuration's discovery.
pub fn check(config: &Config, pods: &PodsCluster) -> Result<(), RenderError> {
    let envoy = matches!(config.discovery, crate::discovery::Discovery::Envoy { .. });
    match (envoy, pods) {
        (true, PodsCluster::OriginalDst) => Err(RenderError::NoPods),
        (false, PodsCluster::Static(_) | PodsCluster::Dns { .. }) => {
            Err(RenderError::PodsWithoutEnvoyDiscovery)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{build, parse_toml, Overrides};
    use crate::env::EnvSnapshot;

    const EXAMPLE: &str = include_str!("../../envoy/kvroute.example.toml");

    fn example() -> Config {
        let file = parse_toml(EXAMPLE, std::path::Path::new("kvroute.example.toml")).unwrap();
        build(file, &EnvSnapshot::default(), &Overrides::default(), 0).unwrap()
    }

    fn opts(filter_config: FilterConfig) -> ModuleOptions {
        ModuleOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 10000)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9901)),
            filter_config,
            pods: PodsCluster::OriginalDst,
        }
    }

    #[test]
    fn envoy_fleet_clusters_are_rendered_and_checked() {
        let c = example();
        let pods = PodsCluster::parse("static:10.0.0.1:8000, 10.0.0.2:8000").unwrap();
        assert_eq!(
            check(&c, &pods),
            Err(RenderError::PodsWithoutEnvoyDiscovery)
        );
        let y = render(
            &c,
            &ModuleOptions {
                pods,
                ..opts(FilterConfig::Path("k.toml".into()))
            },
        );
        assert!(!y.contains("__"), "{y}");
        assert!(y.contains("type: STATIC") && !y.contains("ORIGINAL_DST\n"));
        assert!(y.contains("address: 10.0.0.2, port_value: 8000"));
        assert!(y.contains("envoy.load_balancing_policies.dynamic_modules"));
        let dns = PodsCluster::parse("dns:vllm.default.svc:8000").unwrap();
        assert!(
            PodsCluster::Dns {
                host: "vllm.default.svc".into(),
                port: 8000
            } == dns
        );
        assert!(dns.yaml().contains("type: STRICT_DNS"));
        for bad in ["static:", "static:10.0.0.1", "dns:x", "dns::80", "eds:x"] {
            assert!(PodsCluster::parse(bad).is_err(), "{bad}");
        }
        let envoy = build(
            parse_toml(
                "[discovery]\nsource = \"envoy\"\n[discovery.envoy]\nmodel = \"m\"\n",
                std::path::Path::new("t"),
            )
            .unwrap(),
            &EnvSnapshot::default(),
            &Overrides::default(),
            0,
        )
        .unwrap();
        assert_eq!(
            check(&envoy, &PodsCluster::OriginalDst),
            Err(RenderError::NoPods)
        );
        assert_eq!(check(&envoy, &dns), Ok(()));
    }

    #[test]
    fn every_token_is_filled_and_the_config_is_carried() {
        let y = render(
            &example(),
            &opts(FilterConfig::Path("/etc/kvroute/kvroute.toml".into())),
        );
        assert!(!y.contains("__"), "unfilled token in:\n{y}");
        assert!(y.contains("value: \"/etc/kvroute/kvroute.toml\""));
        let inline = render(&example(), &opts(FilterConfig::Inline(EXAMPLE.into())));
        assert!(!inline.contains("__"));
        // The TOML comes back out of the block scalar line for line (indentation removed).
        let start = inline.find("value: |\n").unwrap() + "value: |\n".len();
        let carried: Vec<&str> = inline[start..]
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with("                  "))
            .map(|l| l.trim_start_matches("                  "))
            .collect();
        let expected: Vec<&str> = EXAMPLE.lines().collect();
        assert_eq!(&carried[..expected.len()], &expected[..]);
    }

    #[test]
    fn shipped_module_yaml_is_the_rendered_example() {
        let shipped = include_str!("../../envoy/envoy.module.yaml");
        assert_eq!(
            shipped,
            render(
                &example(),
                &opts(FilterConfig::Path("envoy/kvroute.example.toml".into()))
            ),
            "re-render envoy/envoy.module.yaml (see envoy/README.md)"
        );
    }
}
