//! What the filter asks of Envoy for one HTTP stream, as a safe trait. The binding
//! ([`crate::abi`]) implements it over Envoy's callbacks; the unit tests implement it over
//! plain maps, so the filter's logic is tested without Envoy.

use std::borrow::Cow;

/// One HTTP stream as the filter sees it, during one of Envoy's calls into the filter.
pub trait StreamHost {
    /// The first value of request header `name` (lower-case), if present.
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    /// Sets (replaces) request header `name`. False if Envoy refused.
    fn set_request_header(&mut self, name: &str, value: &[u8]) -> bool;
    /// The request body Envoy has buffered so far, plus the chunk being delivered: the whole
    /// body at its end when every earlier chunk was held back for buffering. Borrowed from
    /// Envoy when it is one slice, else copied into one buffer.
    fn request_body(&self) -> Cow<'_, [u8]>;
    /// Its size in bytes, without copying it.
    fn request_body_len(&self) -> usize;
    /// Sends the request to `address` (`ip:port`): sets the dynamic metadata
    /// `envoy.lb/x-gateway-destination-endpoint` (the shipped `ORIGINAL_DST` cluster's key, as
    /// with ext_proc), read when Envoy picks the upstream host. The route is not matched again:
    /// the shipped routes send the routed paths to the pods' cluster whatever the filter did
    /// (clearing the route cache and matching again cost about 10 µs of CPU per request at c=32).
    /// (Envoy's `set_upstream_override_host` is not used: an `ORIGINAL_DST` cluster answers 503
    /// for an address it has not created yet, measured on Envoy 1.40.)
    fn set_destination(&mut self, address: &str) -> bool;
    /// The first value of response header `name`, if present.
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// Sets (replaces) response header `name`. False if Envoy refused.
    fn set_response_header(&mut self, name: &str, value: &[u8]) -> bool;
    /// The response chunk being delivered (response-body calls only).
    fn response_chunk(&self) -> Vec<&[u8]>;
    /// Envoy's `response.code_details` attribute, once a response has started.
    fn response_code_details(&self) -> Option<String>;
    /// Envoy's `response.code` attribute, once a response has started.
    fn response_code(&self) -> Option<u16>;
    /// Answers the request locally: `status`, `headers`, `body`, and `details` as Envoy's
    /// `response.code_details`.
    fn send_local_reply(
        &mut self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
        details: &str,
    );
}
