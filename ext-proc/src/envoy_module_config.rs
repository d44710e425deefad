//! Renders `envoy/envoy.module.template.yaml`: Envoy with kvroute inside it (the dynamic module
//! `libkvroute_envoy.so`, crate `kvroute-envoy`) for a kvroute [`Config`]: Envoy's listener and
//! admin addresses, the buffer limit, kvroute's body limit (in Envoy's own 413 message), and
//! the filter's configuration: the path of kvroute's TOML file, or its text.

use std::net::SocketAddr;

use crate::config::Config;

/// The template, shipped in `envoy/`.
pub const TEMPLATE: &str = include_str!("../../envoy/envoy.module.template.yaml");

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

/// The Envoy YAML.
pub fn render(config: &Config, opts: &ModuleOptions) -> String {
    let ip = |a: SocketAddr| a.ip().to_string();
    TEMPLATE
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
        }
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
