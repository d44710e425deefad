//! `kvroute_config_builder_set_ttft`: settings by their TOML names reach least-ttft's model.

use std::ptr;

use super::{add, route};
use crate::*;

/// A least-ttft router with `settings` applied by name.
fn router_with(settings: &[(&str, f64)]) -> *mut kvroute_router {
    let b = kvroute_config_builder_new();
    let spec = "least-ttft";
    assert_eq!(
        kvroute_config_builder_set_strategy(b, spec.as_ptr(), spec.len()),
        kvroute_status::Ok
    );
    for (key, value) in settings {
        assert_eq!(
            kvroute_config_builder_set_ttft(b, key.as_ptr(), key.len(), *value),
            kvroute_status::Ok,
            "{key}"
        );
    }
    let mut config = ptr::null();
    assert_eq!(
        kvroute_config_builder_build(b, &mut config),
        kvroute_status::Ok
    );
    let mut r = ptr::null_mut();
    assert_eq!(kvroute_router_new(config, &mut r), kvroute_status::Ok);
    kvroute_config_free(config);
    r
}

/// The predicted TTFT of the decision that issued `ticket`, from its explanation.
fn predicted_ttft_ms(r: *mut kvroute_router, ticket: kvroute_ticket) -> u64 {
    let mut buf = vec![0u8; 1024];
    let mut n = 0;
    assert_eq!(
        kvroute_router_explain(r, ticket, buf.as_mut_ptr(), buf.len(), &mut n),
        kvroute_status::Ok
    );
    let line = std::str::from_utf8(&buf[..n]).unwrap();
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("pred_ttft_ms="))
        .unwrap_or_else(|| panic!("no prediction in {line}"))
        .parse()
        .unwrap()
}

#[test]
fn ttft_settings_by_name_change_the_prediction() {
    let prompt = "a long shared prompt. ".repeat(400);
    let mut predictions = Vec::new();
    for settings in [
        vec![],
        vec![("prefill_tokens_per_s", 300.0), ("max_seqs", 1.0)],
    ] {
        let r = router_with(&settings);
        add(r, "a", "10.0.0.1:80");
        let first = route(r, prompt.as_bytes(), 1).unwrap();
        // A second request on the one pod: with max_seqs 1 it waits for the first.
        let second = route(r, prompt.as_bytes(), 1).unwrap();
        predictions.push((
            predicted_ttft_ms(r, first.ticket),
            predicted_ttft_ms(r, second.ticket),
        ));
        kvroute_router_free(r);
    }
    let ((default_first, _), (slow_first, slow_second)) = (predictions[0], predictions[1]);
    assert!(
        slow_first > 5 * default_first,
        "a tenth of the prefill rate: {slow_first} vs {default_first}"
    );
    assert!(
        slow_second > slow_first + default_first,
        "one slot: the second waits ({slow_second} vs {slow_first})"
    );
}

#[test]
fn bad_ttft_settings_are_refused_and_leave_the_builder_alone() {
    let b = kvroute_config_builder_new();
    let set =
        |key: &str, value: f64| kvroute_config_builder_set_ttft(b, key.as_ptr(), key.len(), value);
    assert_eq!(set("tpot_ms", 40.0), kvroute_status::Ok);
    assert_eq!(set("tpot", 40.0), kvroute_status::InvalidParameter);
    assert_eq!(set("max_seqs", 2.5), kvroute_status::InvalidParameter);
    assert_eq!(set("learning_rate", 0.0), kvroute_status::InvalidParameter);
    assert_eq!(set("tie_ms", f64::NAN), kvroute_status::InvalidParameter);
    assert_eq!(
        kvroute_config_builder_set_ttft(b, ptr::null(), 4, 1.0),
        kvroute_status::NullParameter
    );
    assert_eq!(
        kvroute_config_builder_set_ttft(b, b"\xff".as_ptr(), 1, 1.0),
        kvroute_status::InvalidUtf8
    );
    assert_eq!(
        kvroute_config_builder_set_ttft(ptr::null_mut(), b"tpot_ms".as_ptr(), 7, 1.0),
        kvroute_status::NullParameter
    );
    let mut config = ptr::null();
    assert_eq!(
        kvroute_config_builder_build(b, &mut config),
        kvroute_status::Ok,
        "still valid"
    );
    kvroute_config_free(config);
}
