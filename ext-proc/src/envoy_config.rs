//! Renders `envoy/envoy.template.yaml` for a kvroute [`Config`]: Envoy's listener and admin
//! addresses, the ext_proc address (kvroute's gRPC listener), the round-robin fallback pool
//! (every configured pod), the buffer limit, kvroute's body limit (in Envoy's own 413 message)
//! the response-headers phase, TLS to kvroute when its listeners serve it, the ext_proc
//! filter's `max_message_timeout` (the longest admission hold) and, when `[admission]` has a
//! model, the request attributes carrying its headers.

use std::net::SocketAddr;

use crate::admission::{attribute_expression, max_message_timeout_secs};
use crate::config::Config;

/// The template, shipped in `envoy/`.
pub const TEMPLATE: &str = include_str!("../../envoy/envoy.template.yaml");

/// Envoy-side settings that are not in the kvroute configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyOptions {
    /// Where Envoy listens for clients.
    pub listen: SocketAddr,
    /// Envoy's admin address.
    pub admin: SocketAddr,
    /// `response_header_mode: SEND` (client gets `target-pod` & co.) or `SKIP`.
    pub response_headers: bool,
    /// TLS from Envoy to kvroute's gRPC listener (`[listen.tls]`), as Envoy reads it.
    pub tls: Option<EnvoyTls>,
}

/// Envoy's side of TLS to kvroute: files as Envoy sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvoyTls {
    /// The CA that signed kvroute's certificate.
    pub ca: String,
    /// Envoy's client certificate chain and key, when kvroute requires one (`client_ca`).
    pub client_cert: Option<(String, String)>,
    /// The server name Envoy sends (SNI).
    pub sni: String,
}

/// The ext_proc cluster's transport socket for `tls`.
fn transport_socket(tls: &EnvoyTls) -> String {
    let mut s = format!(
        "
    transport_socket:                        # TLS to kvroute ([listen.tls])
      name: envoy.transport_sockets.tls
      typed_config:
        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {}
        common_tls_context:
          alpn_protocols: [h2]
          validation_context: {{ trusted_ca: {{ filename: {} }} }}",
        tls.sni, tls.ca
    );
    if let Some((cert, key)) = &tls.client_cert {
        s.push_str(&format!(
            "
          tls_certificates:                  # kvroute requires a client certificate (client_ca)
          - {{ certificate_chain: {{ filename: {cert} }}, private_key: {{ filename: {key} }} }}"
        ));
    }
    s
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 10000)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9901)),
            response_headers: true,
            tls: None,
        }
    }
}

fn ip(addr: SocketAddr) -> String {
    addr.ip().to_string()
}

/// The Envoy YAML.
pub fn render(config: &Config, opts: &EnvoyOptions) -> String {
    let pods = config.all_pods();
    let endpoints = if pods.is_empty() {
        " []".to_owned()
    } else {
        pods.iter()
            .filter_map(|p| p.address.parse::<SocketAddr>().ok())
            .map(|a| {
                format!(
                    "\n        - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}",
                    ip(a),
                    a.port()
                )
            })
            .collect()
    };
    let buffer = config.max_body_bytes.saturating_mul(2);
    let admission = if config.admission.is_on() {
        config
            .admission
            .headers
            .names()
            .into_iter()
            .map(|name| format!("\n              - '{}'", attribute_expression(name)))
            .collect()
    } else {
        " none (admission is off)".to_owned()
    };
    TEMPLATE
        .replace("__ADMIN_ADDRESS__", &ip(opts.admin))
        .replace("__ADMIN_PORT__", &opts.admin.port().to_string())
        .replace("__LISTEN_ADDRESS__", &ip(opts.listen))
        .replace("__LISTEN_PORT__", &opts.listen.port().to_string())
        .replace("__BUFFER_LIMIT__", &buffer.to_string())
        .replace("__MAX_BODY_BYTES__", &config.max_body_bytes.to_string())
        .replace(
            "__RESPONSE_HEADER_MODE__",
            if opts.response_headers {
                "SEND"
            } else {
                "SKIP"
            },
        )
        .replace("__EXT_PROC_ADDRESS__", &ip(config.grpc_listen))
        .replace("__EXT_PROC_PORT__", &config.grpc_listen.port().to_string())
        .replace("__FALLBACK_ENDPOINTS__", &endpoints)
        .replace(
            "__MAX_MESSAGE_TIMEOUT__",
            &format!("{}s", max_message_timeout_secs()),
        )
        .replace("__ADMISSION_ATTRIBUTES__", &admission)
        .replace(
            "__EXT_PROC_TLS__",
            &opts.tls.as_ref().map(transport_socket).unwrap_or_default(),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{build, parse_toml, Overrides};
    use crate::env::EnvSnapshot;

    fn example() -> Config {
        let text = include_str!("../../envoy/kvroute.example.toml");
        let file = parse_toml(text, std::path::Path::new("kvroute.example.toml")).unwrap();
        build(file, &EnvSnapshot::default(), &Overrides::default(), 0).unwrap()
    }

    #[test]
    fn every_token_is_filled() {
        let y = render(&example(), &EnvoyOptions::default());
        assert!(!y.contains("__"), "unfilled token in:\n{y}");
        assert!(y.contains("response_header_mode: SEND"));
        let off = render(
            &example(),
            &EnvoyOptions {
                response_headers: false,
                ..Default::default()
            },
        );
        assert!(off.contains("response_header_mode: SKIP"));
    }

    #[test]
    fn the_template_asks_for_the_request_attributes_kvroute_reads() {
        for (expression, _) in crate::envoy_context::REQUEST_ATTRIBUTES {
            let line = format!("              - '{expression}'\n");
            assert_eq!(TEMPLATE.matches(&line).count(), 1, "{line}");
        }
        assert!(TEMPLATE.contains("request_header_mode: SKIP"));
    }

    #[test]
    fn admission_adds_its_header_attributes_and_the_timer_always_covers_a_hold() {
        let off = render(&example(), &EnvoyOptions::default());
        assert!(off.contains("max_message_timeout: 121s\n"));
        assert!(!off.contains("x-kvroute-priority"));
        let text = include_str!("../../envoy/kvroute.example.toml").to_owned()
            + "[admission]\ntenant_header = \"x-gateway-inference-fairness-id\"\n\
               [admission.objectives]\nbatch = -1\n\
               [admission.models.study]\nttft_target_ms = 2000\n";
        let file = parse_toml(&text, std::path::Path::new("t.toml")).unwrap();
        let c = build(file, &EnvSnapshot::default(), &Overrides::default(), 0).unwrap();
        let on = render(&c, &EnvoyOptions::default());
        for name in [
            "x-kvroute-priority",
            "x-gateway-inference-fairness-id",
            "x-gateway-inference-objective",
        ] {
            let line = format!("              - '{}'\n", attribute_expression(name));
            assert_eq!(on.matches(&line).count(), 1, "{line} in\n{on}");
        }
        assert!(!on.contains("__"));
    }

    #[test]
    fn shipped_envoy_yaml_is_the_rendered_example() {
        let shipped = include_str!("../../envoy/envoy.yaml");
        assert_eq!(
            shipped,
            render(&example(), &EnvoyOptions::default()),
            "re-render envoy/envoy.yaml (see envoy/README.md)"
        );
    }
}
