//! The configuration's tests: the TOML schema, the layering of file, environment and flags,
//! and the errors.

use super::*;

/// Loads `text` (a configuration without models is allowed: most tests set no pods).
fn load(text: &str, env: &[(&str, &str)], o: Overrides) -> Result<Config, ConfigError> {
    strict(
        text,
        env,
        Overrides {
            allow_no_models: true,
            ..o
        },
    )
}

fn strict(text: &str, env: &[(&str, &str)], o: Overrides) -> Result<Config, ConfigError> {
    let file = parse_toml(text, Path::new("t.toml"))?;
    build(file, &EnvSnapshot::from_pairs(env), &o, 7)
}

const FILE: &str = r#"
    [routing]
    default_strategy = "least-request"
    [prefix_cache]
    block_size = 64
    [models.study]
    pods = [{ name = "a", address = "127.0.0.1:8001" }, { name = "b", address = "127.0.0.1:8002" }]
"#;

#[test]
fn a_configuration_without_models_or_with_an_empty_model_is_refused_unless_allowed() {
    let err = |text: &str, o: Overrides| match strict(text, &[], o) {
        Err(ConfigError::Pods(m)) => m,
        other => panic!("{text:?}: {other:?}"),
    };
    assert!(err("", Overrides::default()).contains("allow_no_models"));
    assert!(err("[models.m]\npods = []", Overrides::default()).contains("allow_no_pods"));
    let flag = Overrides {
        allow_no_models: true,
        ..Default::default()
    };
    assert!(strict("", &[], flag).unwrap().models.is_empty());
    let explicit = "[models.m]\nallow_no_pods = true\npods = []";
    assert!(strict(explicit, &[], Overrides::default()).unwrap().models["m"].is_empty());
}

#[test]
fn defaults_listen_on_loopback() {
    let none = Overrides {
        allow_no_models: true,
        ..Default::default()
    };
    let c = load("", &[], none).unwrap();
    assert!(c.grpc_listen.ip().is_loopback() && c.admin_listen.ip().is_loopback());
    assert_eq!(c.default_strategy_text, "prefix-cache");
    assert_eq!(c.router.seed, 7);
    assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let c = load(FILE, &[], Overrides::default()).unwrap();
    assert_eq!(c.default_strategy_text, "least-request");
    assert_eq!(c.router.block_size, 64);
    assert_eq!(c.models["study"].len(), 2);

    let env = [
        ("ROUTING_ALGORITHM", "random"),
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "32"),
    ];
    let c = load(FILE, &env, Overrides::default()).unwrap();
    assert_eq!(c.default_strategy_text, "random");
    assert_eq!(c.router.block_size, 32);

    let o = Overrides {
        default_strategy: Some("prefix-cache".into()),
        ..Default::default()
    };
    assert_eq!(
        load(FILE, &env, o).unwrap().default_strategy_text,
        "prefix-cache"
    );
}

#[test]
fn bad_files_are_typed_errors() {
    assert!(matches!(
        load("[listen]\nbogus = 1", &[], Overrides::default()),
        Err(ConfigError::Toml { .. })
    ));
    assert!(matches!(
        load(
            "[routing]\ndefault_strategy = \"fastest\"",
            &[],
            Overrides::default()
        ),
        Err(ConfigError::Strategy { .. })
    ));
    let bad_addr = "[models.m]\npods = [{ name = \"a\", address = \"localhost:1\" }]";
    assert!(matches!(
        load(bad_addr, &[], Overrides::default()),
        Err(ConfigError::Pods(_))
    ));
    let dup = "[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }, { name = \"a\", address = \"127.0.0.1:2\" }]";
    assert!(matches!(
        load(dup, &[], Overrides::default()),
        Err(ConfigError::Pods(_))
    ));
    assert!(matches!(
        load("[prefix_cache]\nblock_size = 0", &[], Overrides::default()),
        Err(ConfigError::Router(_))
    ));
    assert!(matches!(
        load("[limits]\nmax_body_bytes = 0", &[], Overrides::default()),
        Err(ConfigError::Limit(_))
    ));
    assert!(matches!(
        load(
            "[routing]\ndefault_model = \"x\"",
            &[],
            Overrides::default()
        ),
        Err(ConfigError::Pods(_))
    ));
}

#[test]
fn ttft_section_maps_to_the_core_with_its_defaults() {
    let c = load(
        "[routing]\nallow_no_models = true",
        &[],
        Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.router.ttft, TtftConfig::default());
    assert_eq!(c.scrape_interval, Some(DEFAULT_SCRAPE_INTERVAL));
    assert_eq!(c.scrape_timeout, DEFAULT_SCRAPE_TIMEOUT);
    let text = "[routing]\ndefault_strategy = \"least-ttft\"\n[ttft]\nengine_block_tokens = 1568\nmax_seqs = 8\ntpot_ms = 57.5\nsnapshot_max_age_ms = 500\nstall_weight = 0.5\nexplore_wait_ms = 0\n[engine_metrics]\nscrape_interval_ms = 0\n[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\", max_seqs = 4 }]";
    let c = load(text, &[], Overrides::default()).unwrap();
    assert_eq!(c.default_strategy_text, "least-ttft");
    let t = &c.router.ttft;
    assert_eq!((t.engine_block_tokens, t.max_seqs), (1568, 8));
    assert_eq!((t.tpot_ms, t.snapshot_max_age_ms), (57.5, 500));
    assert_eq!(t.stall_weight, 0.5);
    assert_eq!(t.explore_wait_ms, 0.0);
    assert_eq!(
        t.prefill_tokens_per_s,
        TtftConfig::default().prefill_tokens_per_s
    );
    assert_eq!(c.scrape_interval, None);
    assert_eq!(c.models["m"][0].max_seqs, Some(4));

    let env = [("ROUTING_ALGORITHM", "least-ttft")];
    assert_eq!(
        load(
            "[routing]\nallow_no_models = true",
            &env,
            Overrides::default()
        )
        .unwrap()
        .default_strategy_text,
        "least-ttft"
    );
    let flag = Overrides {
        default_strategy: Some("least-ttft".into()),
        ..Default::default()
    };
    assert_eq!(
        load("", &[], flag).unwrap().default_strategy_text,
        "least-ttft"
    );

    for bad in [
        "[ttft]\nmax_seqs = 0",
        "[ttft]\nlearning_rate = 1.5",
        "[ttft]\nprefill_tokens_per_s = -1.0",
        "[ttft]\nstall_weight = -1.0",
        "[ttft]\nexplore_wait_ms = -1.0",
    ] {
        assert!(
            matches!(
                load(bad, &[], Overrides::default()),
                Err(ConfigError::Router(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        load("[ttft]\nbogus = 1", &[], Overrides::default()),
        Err(ConfigError::Toml { .. })
    ));
    assert!(matches!(
        load(
            "[engine_metrics]\nscrape_timeout_ms = 0",
            &[],
            Overrides::default()
        ),
        Err(ConfigError::Limit(_))
    ));
    let zero = "[models.m]\npods = [{ name = \"a\", address = \"127.0.0.1:1\", max_seqs = 0 }]";
    assert!(matches!(
        load(zero, &[], Overrides::default()),
        Err(ConfigError::Pods(_))
    ));
    let two = "[models.m1]\npods = [{ name = \"a\", address = \"127.0.0.1:1\", max_seqs = 2 }]\n[models.m2]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]";
    assert!(matches!(
        load(two, &[], Overrides::default()),
        Err(ConfigError::Pods(_))
    ));
}

/// Unset, `ttft.snapshot_max_age_ms` is twice the scrape interval: a snapshot stays fresh
/// until one scrape is missed, whatever the interval.
#[test]
fn the_snapshot_max_age_follows_the_scrape_interval_unless_set() {
    let max_age = |section: &str| {
        let text = format!(
            "{section}\n[models.m]\npods = [{{ name = \"a\", address = \"127.0.0.1:1\" }}]"
        );
        load(&text, &[], Overrides::default())
            .unwrap()
            .router
            .ttft
            .snapshot_max_age_ms
    };
    assert_eq!(max_age(""), 2_000, "the default interval, 1 s");
    assert_eq!(
        max_age("[engine_metrics]\nscrape_interval_ms = 5000"),
        10_000
    );
    assert_eq!(
        max_age("[engine_metrics]\nscrape_interval_ms = 0"),
        2_000,
        "no scraping"
    );
    let set = "[ttft]\nsnapshot_max_age_ms = 700\n[engine_metrics]\nscrape_interval_ms = 5000";
    assert_eq!(max_age(set), 700);
}

#[test]
fn a_pod_may_serve_two_models_at_one_address() {
    let two = "[models.m1]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]\n[models.m2]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]";
    assert_eq!(
        load(two, &[], Overrides::default())
            .unwrap()
            .all_pods()
            .len(),
        1
    );
    let clash = "[models.m1]\npods = [{ name = \"a\", address = \"127.0.0.1:1\" }]\n[models.m2]\npods = [{ name = \"a\", address = \"127.0.0.1:2\" }]";
    assert!(matches!(
        load(clash, &[], Overrides::default()),
        Err(ConfigError::Pods(_))
    ));
}
