//! What Envoy passes kvroute besides headers and bodies: the attributes its ext_proc filter
//! is asked for (`request_attributes`, `response_attributes`), and the dynamic metadata it
//! forwards (`metadata_options.forwarding_namespaces`), where a Gateway API Inference
//! Extension gateway puts its endpoint subset hint.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::{value::Kind, Struct};

use crate::routing::RequestInfo;

/// The metadata namespace of the Gateway API Inference Extension's subset hint.
pub const SUBSET_HINT_NAMESPACE: &str = "envoy.lb.subset_hint";
/// Its key: the candidate endpoints, `ip:port` each.
pub const SUBSET_HINT_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The response attribute that says who made a response and why (`via_upstream`, or Envoy's
/// reason for its own reply).
pub const CODE_DETAILS: &str = "response.code_details";

/// The request attributes kvroute reads, each the CEL expression the shipped configuration
/// lists in `request_attributes` (Envoy keys each value by its expression's text). With
/// `request_header_mode: SKIP` they are what kvroute knows of the request headers: Envoy
/// evaluates them when it sends its first message of the request (the body), and sends them
/// with it. In this order: the path without the query string (`:path`), the request id
/// (`x-request-id`) and the `routing-strategy` header.
///
/// A header value a client sent may be any bytes, and Envoy passes it into a protobuf
/// string as it is: one value that is not UTF-8 makes the whole message undecodable (prost
/// checks strings; the side stream would fail and the request fall back unrouted). So each
/// header is passed only when it is UTF-8 (RE2's `.` matches no invalid byte, measured on
/// Envoy 1.40): otherwise the id is left out (`1/0` makes the expression fail, and Envoy
/// leaves failed ones out) and the strategy becomes U+FFFD (unreadable: a bad strategy, 400),
/// as when the header itself is read. The path needs no check: the routes only pass the
/// routed paths to kvroute, and Envoy refuses a request line with bytes outside ASCII.
pub const REQUEST_ATTRIBUTES: [(&str, &str); 4] = [
    ("request.url_path", ":path"),
    (
        r#"request.id.matches("^.*$") ? request.id : 1/0"#,
        "x-request-id",
    ),
    (
        r#"request.headers["routing-strategy"].matches("^.*$") ? request.headers["routing-strategy"] : "\uFFFD""#,
        "routing-strategy",
    ),
    (
        r#"request.headers["x-session-id"].matches("^.*$") ? request.headers["x-session-id"] : 1/0"#,
        "x-session-id",
    ),
];

/// Reads the request attributes of [`REQUEST_ATTRIBUTES`] into `info`, as the request
/// headers they stand for ([`RequestInfo::read_header`]); absent ones change nothing, and an
/// empty request id counts as absent. Returns whether any was there.
pub fn read_request_attributes(
    attributes: &HashMap<String, Struct>,
    info: &mut RequestInfo,
) -> bool {
    let mut any = false;
    for (expression, header) in REQUEST_ATTRIBUTES {
        if let Some(value) = string_attribute(attributes, expression) {
            any = true;
            if !(value.is_empty() && header == "x-request-id") {
                info.read_header(header, value.as_bytes());
            }
        }
    }
    any
}

/// The string attribute `name` from an attributes map (Envoy keys it by filter name; every
/// entry is searched, so a renamed filter still works).
pub fn string_attribute(attributes: &HashMap<String, Struct>, name: &str) -> Option<String> {
    attributes
        .values()
        .find_map(|s| match s.fields.get(name)?.kind.as_ref()? {
            Kind::StringValue(v) => Some(v.clone()),
            _ => None,
        })
}

/// The endpoint subset the gateway allows, when it passed one: a list of `ip:port` strings,
/// or one string of them separated by commas. `None` when there is no hint; an empty list is a
/// hint that allows nothing.
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let value = metadata?
        .filter_metadata
        .get(SUBSET_HINT_NAMESPACE)?
        .fields
        .get(SUBSET_HINT_KEY)?;
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect()
    };
    match value.kind.as_ref()? {
        Kind::StringValue(s) => Some(split(s)),
        Kind::ListValue(l) => Some(
            l.values
                .iter()
                .filter_map(|v| match v.kind.as_ref()? {
                    Kind::StringValue(s) => Some(split(s)),
                    _ => None,
                })
                .flatten()
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::{ListValue, Value};

    use super::*;

    fn string(s: &str) -> Value {
        Value {
            kind: Some(Kind::StringValue(s.to_owned())),
        }
    }

    fn metadata(value: Value) -> Metadata {
        let hint = Struct {
            fields: [(SUBSET_HINT_KEY.to_owned(), value)].into_iter().collect(),
        };
        Metadata {
            filter_metadata: [(SUBSET_HINT_NAMESPACE.to_owned(), hint)]
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_subset_hint_is_read_as_a_list_or_a_comma_separated_string() {
        assert_eq!(subset_hint(None), None);
        assert_eq!(subset_hint(Some(&Metadata::default())), None);
        let list = Value {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![string("10.0.0.1:80"), string("10.0.0.2:80")],
            })),
        };
        let want = vec!["10.0.0.1:80".to_owned(), "10.0.0.2:80".to_owned()];
        assert_eq!(subset_hint(Some(&metadata(list))), Some(want.clone()));
        let text = string("10.0.0.1:80, 10.0.0.2:80");
        assert_eq!(subset_hint(Some(&metadata(text))), Some(want));
        assert_eq!(subset_hint(Some(&metadata(string("")))), Some(vec![]));
    }

    #[test]
    fn request_attributes_are_read_as_the_headers_they_stand_for() {
        let attrs = |values: &[(usize, &str)]| -> HashMap<String, Struct> {
            let fields = values
                .iter()
                .map(|(i, v)| (REQUEST_ATTRIBUTES[*i].0.to_owned(), string(v)))
                .collect();
            [("envoy.filters.http.ext_proc".to_owned(), Struct { fields })].into()
        };
        let mut info = RequestInfo::default();
        assert!(!read_request_attributes(&HashMap::new(), &mut info));
        assert_eq!(info, RequestInfo::default());
        let all = attrs(&[(0, "/v1/completions"), (1, "rid"), (2, "random")]);
        assert!(read_request_attributes(&all, &mut info));
        assert_eq!(info.path, "/v1/completions");
        assert_eq!(info.request_id.as_deref(), Some("rid"));
        assert_eq!(info.strategy.as_deref(), Some("random"));
        // An empty id and a blank strategy count as absent.
        let mut info = RequestInfo::default();
        assert!(read_request_attributes(
            &attrs(&[(1, ""), (2, " ")]),
            &mut info
        ));
        assert_eq!(info, RequestInfo::default());
    }

    #[test]
    fn string_attributes_are_found_under_any_filter_name() {
        let attrs: HashMap<String, Struct> = [(
            "envoy.filters.http.ext_proc".to_owned(),
            Struct {
                fields: [(CODE_DETAILS.to_owned(), string("via_upstream"))]
                    .into_iter()
                    .collect(),
            },
        )]
        .into_iter()
        .collect();
        assert_eq!(
            string_attribute(&attrs, CODE_DETAILS).as_deref(),
            Some("via_upstream")
        );
        assert_eq!(string_attribute(&attrs, "response.flags"), None);
        assert_eq!(string_attribute(&HashMap::new(), CODE_DETAILS), None);
    }
}
