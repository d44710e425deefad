//! A request's priority and tenant: read from its headers (request headers, or, with
//! `request_header_mode: SKIP`, the request attributes the rendered Envoy configuration asks
//! for), resolved with `[admission]`'s settings.

use std::collections::HashMap;

use envoy_types::pb::google::protobuf::Struct;
use kvroute_core::Priority;

use super::config::{AdmissionHeaders, OBJECTIVE_HEADER};

/// The admission headers as the request sent them (values trimmed; blank ones absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionInputs {
    /// The priority header's value.
    pub priority: Option<String>,
    /// The tenant header's value.
    pub tenant: Option<String>,
    /// `x-gateway-inference-objective`'s value.
    pub objective: Option<String>,
}

/// The CEL expression of the request attribute carrying header `name` (lower-case), as the
/// rendered Envoy configuration lists it: the value only when it is UTF-8 (else the expression
/// fails and Envoy leaves it out; see [`crate::envoy_context::REQUEST_ATTRIBUTES`]).
pub fn attribute_expression(name: &str) -> String {
    format!(r#"request.headers["{name}"].matches("^.*$") ? request.headers["{name}"] : 1/0"#)
}

impl AdmissionInputs {
    /// Reads one request header (`key` lower-case) if it is one of `headers`'. Non-UTF-8
    /// values count as absent.
    pub fn read_header(&mut self, headers: &AdmissionHeaders, key: &str, value: &[u8]) {
        let slot = if key == headers.priority {
            &mut self.priority
        } else if headers.tenant.as_deref() == Some(key) {
            &mut self.tenant
        } else if key == OBJECTIVE_HEADER && !headers.objectives.is_empty() {
            &mut self.objective
        } else {
            return;
        };
        let value = std::str::from_utf8(value).map(str::trim).unwrap_or("");
        *slot = (!value.is_empty()).then(|| value.to_owned());
    }

    /// Reads the request attributes standing for `headers`' headers
    /// ([`attribute_expression`]); absent ones change nothing.
    pub fn read_attributes(
        &mut self,
        headers: &AdmissionHeaders,
        attributes: &HashMap<String, Struct>,
    ) {
        for name in headers.names() {
            let expression = attribute_expression(name);
            if let Some(v) = crate::envoy_context::string_attribute(attributes, &expression) {
                self.read_header(headers, name, v.as_bytes());
            }
        }
    }

    /// The request's priority: the priority header's when it parses ([`Priority::parse`]),
    /// else its objective's (an objective `[admission.objectives]` does not list is
    /// standard, as GIE treats one without an `InferenceObjective`), else standard.
    pub fn priority(&self, headers: &AdmissionHeaders) -> i32 {
        self.priority
            .as_deref()
            .and_then(Priority::parse)
            .or_else(|| {
                let o = self.objective.as_deref()?;
                headers.objectives.get(o).copied()
            })
            .unwrap_or(Priority::STANDARD)
    }
}

/// A priority's class for metric labels (bounded): `critical` (> 0, served late rather than
/// shed), `standard` (0) or `sheddable` (< 0).
pub fn priority_class(priority: i32) -> &'static str {
    match priority {
        p if p > 0 => "critical",
        0 => "standard",
        _ => "sheddable",
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::{value::Kind, Value};

    use super::*;

    fn headers() -> AdmissionHeaders {
        AdmissionHeaders {
            priority: "x-prio".into(),
            tenant: Some("x-tenant".into()),
            objectives: [("premium".to_owned(), 10), ("batch".to_owned(), -1)].into(),
        }
    }

    #[test]
    fn headers_give_the_priority_the_objective_or_standard() {
        let h = headers();
        let read = |pairs: &[(&str, &[u8])]| {
            let mut i = AdmissionInputs::default();
            for (k, v) in pairs {
                i.read_header(&h, k, v);
            }
            i
        };
        assert_eq!(read(&[]).priority(&h), 0);
        assert_eq!(read(&[("x-prio", b" sheddable ")]).priority(&h), -1);
        assert_eq!(read(&[("x-prio", b"7")]).priority(&h), 7);
        let premium = read(&[(OBJECTIVE_HEADER, b"premium")]);
        assert_eq!(premium.priority(&h), 10);
        assert_eq!(read(&[(OBJECTIVE_HEADER, b"unknown")]).priority(&h), 0);
        // The priority header wins when it parses; a value that does not falls back.
        let both = read(&[("x-prio", b"critical"), (OBJECTIVE_HEADER, b"batch")]);
        assert_eq!(both.priority(&h), 1);
        let junk = read(&[("x-prio", b"urgent"), (OBJECTIVE_HEADER, b"batch")]);
        assert_eq!(junk.priority(&h), -1);
        let t = read(&[("x-tenant", b" team-a "), ("x-other", b"1")]);
        assert_eq!(t.tenant.as_deref(), Some("team-a"));
        assert_eq!(read(&[("x-tenant", b"\xff")]).tenant, None);
        // Without objectives, the objective header is not read.
        let plain = AdmissionHeaders::default();
        let mut i = AdmissionInputs::default();
        i.read_header(&plain, OBJECTIVE_HEADER, b"premium");
        assert_eq!(i, AdmissionInputs::default());
    }

    #[test]
    fn attributes_are_read_by_their_expression() {
        let h = headers();
        let fields = [
            (attribute_expression("x-prio"), "-3"),
            (attribute_expression("x-tenant"), "t"),
            (attribute_expression(OBJECTIVE_HEADER), "premium"),
        ]
        .into_iter()
        .map(|(k, v)| {
            let v = Value {
                kind: Some(Kind::StringValue(v.to_owned())),
            };
            (k, v)
        })
        .collect();
        let attrs: HashMap<String, Struct> =
            [("envoy.filters.http.ext_proc".to_owned(), Struct { fields })].into();
        let mut i = AdmissionInputs::default();
        i.read_attributes(&h, &attrs);
        assert_eq!(i.priority(&h), -3);
        assert_eq!(i.tenant.as_deref(), Some("t"));
        assert_eq!(i.objective.as_deref(), Some("premium"));
        assert_eq!(
            attribute_expression("x-prio"),
            r#"request.headers["x-prio"].matches("^.*$") ? request.headers["x-prio"] : 1/0"#
        );
    }

    #[test]
    fn priority_classes_are_three() {
        assert_eq!(priority_class(100), "critical");
        assert_eq!(priority_class(0), "standard");
        assert_eq!(priority_class(-10), "sheddable");
    }
}
