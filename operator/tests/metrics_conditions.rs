//! `quiver_operator_mcpservers` counts every condition type the operator sets.

use quiver_operator::metrics::Metrics;

#[test]
fn every_condition_the_operator_sets_is_counted() {
    let m = Metrics::default();
    let conditions = [
        ("Ready", "True"),
        ("Progressing", "False"),
        ("ConfigValid", "True"),
        ("Degraded", "False"),
        ("UpstreamsReady", "False"),
        ("UpstreamsReady", "False"),
    ];
    m.set_conditions(conditions.iter().copied());
    let text = m.encode();
    for (condition, status) in [
        ("Ready", "True"),
        ("Progressing", "False"),
        ("ConfigValid", "True"),
        ("Degraded", "False"),
    ] {
        let series = format!("quiver_operator_mcpservers{{condition=\"{condition}\",status=\"{status}\"}} 1");
        assert!(text.contains(&series), "missing {series} in:\n{text}");
    }
    let upstreams = "quiver_operator_mcpservers{condition=\"UpstreamsReady\",status=\"False\"} 2";
    assert!(text.contains(upstreams), "missing {upstreams} in:\n{text}");
    let help = text
        .lines()
        .find(|l| l.starts_with("# HELP quiver_operator_mcpservers "))
        .unwrap_or_default();
    assert!(help.contains("UpstreamsReady"), "{help}");
}
