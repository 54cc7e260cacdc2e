use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser as _;

use quiver_model::spec::context::SecretRef;

use super::*;
use crate::cli::duration;

#[test]
fn duration_flags() {
    assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
    assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
    assert_eq!(duration("0s"), Ok(Duration::ZERO));
    assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(duration("24h"), Ok(Duration::from_secs(24 * 3600)));
    assert!(duration("10").is_err());
    assert!(duration("-1s").is_err());
    assert!(duration("1e300m").is_err());
    assert!(duration("ten s").is_err());
}

/// What the operator renders for `spec.tasks.ttl` at its documented maximum starts the
/// server (it once refused `1h`, which the McpServer accepted).
#[test]
fn every_duration_flag_takes_hours() {
    let cli = Cli::try_parse_from([
        "quiver-server",
        "--config=file:/etc/quiver/tools.yaml",
        "--tasks-ttl=24h",
        "--request-timeout=1h",
        "--shutdown-grace=1h",
    ])
    .map_err(|e| e.to_string());
    let cli = cli.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cli.serve.tasks_ttl, Duration::from_secs(24 * 3600));
}

#[test]
fn admin_listen_is_an_address_or_off() {
    assert_eq!("off".parse(), Ok(AdminListen::Off));
    assert_eq!(
        "127.0.0.1:9".parse(),
        Ok(AdminListen::At(SocketAddr::from(([127, 0, 0, 1], 9))))
    );
    assert!("9090".parse::<AdminListen>().is_err());
    assert!("Off".parse::<AdminListen>().is_err());
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn parse_serve_reads_arguments_and_literal_environment() {
    let serve = parse_serve(
        &args(&["--config=configmap:ns/tools", "--tasks-ttl=24h"]),
        [
            ("QUIVER_INSTANCE", "ns/weather"),
            ("QUIVER_PIN_WORKERS", "true"),
            ("QUIVER_ALLOWED_ORIGINS", "https://a.example,https://b.example"),
            // Not a flag's variable (a secret the server reads itself): passed over.
            ("QUIVER_TASKS_REDIS_PASSWORD", "hunter2"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(serve.tasks_ttl, Duration::from_secs(24 * 3600));
    assert!(serve.pin_workers);
    assert_eq!(serve.allowed_origins.len(), 2);
    assert_eq!(
        serve.instance,
        Some(Instance {
            namespace: "ns".into(),
            name: "weather".into()
        })
    );
    // A flag without a value set to a false word through its variable stays off.
    let serve = parse_serve(&args(&[]), [("QUIVER_PIN_WORKERS", "false")]).unwrap();
    assert!(!serve.pin_workers);
}

/// The class the operator must never render: each kind of value the server refuses is
/// reported with the flag's name, whether it came as an argument or a variable.
#[test]
fn parse_serve_reports_what_the_server_would_refuse() {
    for (given, flag) in [
        (vec!["--tasks-ttl=1d"], "--tasks-ttl"),
        (vec!["--tasks-max=0"], "--tasks-max"),
        (vec!["--trusted-proxies=10.0.0.0/33"], "--trusted-proxies"),
        (vec!["--audit=syslog"], "--audit"),
        (vec!["--limits-redis-fail=maybe"], "--limits-redis-fail"),
        (vec!["--no-such-flag"], "--no-such-flag"),
        (vec!["--listen=localhost"], "--listen"),
        (vec!["--audit-queue=1000000"], "--audit-queue"),
        (vec!["--audit-queue=0"], "--audit-queue"),
    ] {
        let err = parse_serve(&args(&given), []).expect_err(given[0]);
        assert!(err.contains(flag), "{given:?}: {err}");
    }
    let err = parse_serve(&args(&[]), [("QUIVER_INSTANCE", "Not/Valid")]).unwrap_err();
    assert!(err.contains("--instance"), "{err}");
    let err = parse_serve(&args(&["check", "--config=file:/x"]), []).unwrap_err();
    assert!(err.contains("subcommand"), "{err}");
}

/// The check reads no variable of the process running it (the operator's own environment
/// is not the pod's): this test runs itself again with a server variable set to a value the
/// server refuses, and the check in that process still parses the defaults.
#[test]
fn parse_serve_ignores_this_process_environment() {
    const CHILD: &str = "QUIVER_FLAGS_TEST_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let serve = parse_serve(&args(&[]), []).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(serve.tasks_ttl, Duration::from_secs(600));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::parse_serve_ignores_this_process_environment",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .env("QUIVER_TASKS_TTL", "not a duration")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

fn r(name: &str, key: &str) -> SecretRef {
    SecretRef {
        name: name.into(),
        key: key.into(),
    }
}

#[test]
fn sources_parse() {
    assert_eq!("kube:ns".parse(), Ok(SecretSource::Kube("ns".into())));
    assert_eq!("dir:/s".parse(), Ok(SecretSource::Dir("/s".into())));
    assert_eq!("env".parse(), Ok(SecretSource::Env));
    for bad in ["kube:", "dir:", "file:/x", "", "envx"] {
        assert!(bad.parse::<SecretSource>().is_err(), "{bad}");
    }
    assert_eq!(parse_ref("api.token"), Ok(r("api", "token")));
    assert!(parse_ref("api").is_err());
    assert!(parse_ref(".k").is_err());
}

#[test]
fn parses_sources() {
    assert_eq!(
        "file:/etc/q.yaml".parse::<Source>().unwrap(),
        Source::File("/etc/q.yaml".into())
    );
    assert_eq!(
        "configmap:ns/tools".parse::<Source>().unwrap(),
        Source::ConfigMap {
            namespace: "ns".into(),
            name: "tools".into()
        }
    );
    assert!("configmap:ns".parse::<Source>().is_err());
    assert!("http://x".parse::<Source>().is_err());
}

#[test]
fn upstream_sign_in_deny_cidr_repeats_and_refuses_what_is_not_a_network() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["quiver-server", "--config=file:/t.yaml"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.serve.upstream_sign_in_deny_cidrs)
    };
    let nets = parse(&[
        "--upstream-sign-in-deny-cidr=11.0.0.0/8",
        "--upstream-sign-in-deny-cidr=2600:1f00::/24,203.0.114.7",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(nets.len(), 3);
    assert!(nets[0].contains("11.2.3.4".parse().unwrap()) && !nets[0].contains("12.0.0.1".parse().unwrap()));
    assert!(parse(&["--upstream-sign-in-deny-cidr=11.0.0.0/33"]).is_err());
    assert!(parse(&["--upstream-sign-in-deny-cidr=pods"]).is_err());
    assert!(parse(&[]).unwrap().is_empty());
}

#[test]
fn server_card_flags_take_only_what_a_card_may_hold() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["quiver-server", "--config=file:/t.yaml"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).map(|c| c.serve)
    };
    let s = parse(&[
        "--server-card-name=com.example.team-a/weather",
        "--server-card-description=Forecasts for any city",
        "--server-card-url=https://weather.example.com/mcp,http://weather.example.org/mcp",
        "--server-card-website-url=https://docs.example.com/weather",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.server_card_name.as_deref(), Some("com.example.team-a/weather"));
    assert_eq!(s.server_card_urls.len(), 2);
    assert!(parse(&[]).unwrap().server_card_name.is_none(), "off by default");
    for bad in [
        "--server-card-name=weather",
        "--server-card-name=a/b/c",
        "--server-card-name=com.example/we ather",
        "--server-card-name=com_example/weather",
        "--server-card-description=",
        "--server-card-description=two\nlines",
        "--server-card-url=ftp://x/mcp",
        "--server-card-url=https://",
        "--server-card-url=https://a b/mcp",
        "--server-card-website-url=javascript:alert(1)",
    ] {
        assert!(parse(&[bad]).is_err(), "{bad}");
    }
    let long = format!("--server-card-description={}", "é".repeat(101));
    assert!(parse(&[&long]).is_err());
    let fits = format!("--server-card-description={}", "é".repeat(100));
    assert!(parse(&[&fits]).is_ok());
}
