use super::*;

fn index(tools: &[(&str, &str, &[&str])]) -> Index {
    Index::build(tools.iter().map(|(name, description, params)| {
        let doc = Doc {
            name,
            title: None,
            description,
        };
        (doc, params.to_vec())
    }))
}

fn names<'a>(tools: &[(&'a str, &str, &[&str])], ix: &Index, query: &str, limit: usize) -> Vec<&'a str> {
    let mut scratch = Scratch::default();
    let mut hits = Vec::new();
    ix.search(query, limit, &mut scratch, |_| true, &mut hits);
    hits.iter().map(|(i, _)| tools[*i].0).collect()
}

const TOOLS: &[(&str, &str, &[&str])] = &[
    (
        "listCoreV1NamespacedPod",
        "list or watch objects of kind Pod",
        &["namespace", "labelSelector"],
    ),
    (
        "listCoreV1PodForAllNamespaces",
        "list or watch objects of kind Pod",
        &["labelSelector"],
    ),
    (
        "readCoreV1NamespacedPod",
        "read the specified Pod",
        &["name", "namespace"],
    ),
    (
        "deleteCoreV1NamespacedPod",
        "delete a Pod",
        &["name", "namespace"],
    ),
    (
        "createCoreV1NamespacedConfigMap",
        "create a ConfigMap",
        &["namespace", "body"],
    ),
    ("get_weather", "Current weather for a city", &["city"]),
    (
        "send_email",
        "Send an email message to a recipient",
        &["to", "subject", "body"],
    ),
];

#[test]
fn plain_words_find_camel_case_operations() {
    let ix = index(TOOLS);
    assert_eq!(
        names(TOOLS, &ix, "list the pods in a namespace", 1),
        ["listCoreV1NamespacedPod"]
    );
    assert_eq!(
        names(TOOLS, &ix, "list pods across all namespaces", 1),
        ["listCoreV1PodForAllNamespaces"]
    );
    assert_eq!(
        names(TOOLS, &ix, "show me one pod", 1),
        ["readCoreV1NamespacedPod"]
    );
    assert_eq!(
        names(TOOLS, &ix, "remove a pod", 1),
        ["deleteCoreV1NamespacedPod"]
    );
    assert_eq!(
        names(TOOLS, &ix, "add a configmap", 1),
        ["createCoreV1NamespacedConfigMap"]
    );
    assert_eq!(
        names(TOOLS, &ix, "new cm", 1),
        ["createCoreV1NamespacedConfigMap"]
    );
    assert_eq!(
        names(TOOLS, &ix, "what's the weather in Paris", 1),
        ["get_weather"]
    );
    assert_eq!(names(TOOLS, &ix, "mail someone a message", 1), ["send_email"]);
}

#[test]
fn results_are_ranked_limited_and_only_matches() {
    let ix = index(TOOLS);
    let all = names(TOOLS, &ix, "pod", 10);
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(names(TOOLS, &ix, "pod", 2), all[..2]);
    assert!(names(TOOLS, &ix, "zebra", 10).is_empty());
    assert!(names(TOOLS, &ix, "pod", 0).is_empty());
}

#[test]
fn keep_hides_tools_and_others_take_their_place() {
    let ix = index(TOOLS);
    let mut scratch = Scratch::default();
    let mut hits = Vec::new();
    let mut asked = 0;
    ix.search(
        "pod",
        2,
        &mut scratch,
        |i| {
            asked += 1;
            i != 0 && i != 2
        },
        &mut hits,
    );
    let got: Vec<usize> = hits.iter().map(|h| h.0).collect();
    assert_eq!(got.len(), 2);
    assert!(!got.contains(&0) && !got.contains(&2), "{got:?}");
    assert!(asked <= 4);
}

#[test]
fn the_scratch_is_reused_and_leaves_no_scores_behind() {
    let ix = index(TOOLS);
    let mut scratch = Scratch::default();
    let mut a = Vec::new();
    let mut b = Vec::new();
    ix.search("delete pod", 3, &mut scratch, |_| true, &mut a);
    ix.search("weather", 3, &mut scratch, |_| true, &mut b);
    ix.search("delete pod", 3, &mut scratch, |_| true, &mut b);
    assert_eq!(a, b);
}

#[test]
fn hostile_queries_are_bounded() {
    let ix = index(TOOLS);
    let mut scratch = Scratch::default();
    let mut hits = Vec::new();
    let long = "pod ".repeat(100_000);
    let many: String = (0..5000).map(|i| format!("w{i} ")).collect();
    for q in [
        "",
        "   ",
        "🙂🙂🙂",
        "\u{0}\u{1}",
        &long,
        &many,
        "é".repeat(2000).as_str(),
        "_-_-.,;",
    ] {
        ix.search(q, 50, &mut scratch, |_| true, &mut hits);
        assert!(hits.len() <= TOOLS.len());
    }
    assert!(scratch_terms(&mut scratch, &ix, &many) <= MAX_QUERY_TERMS);
}

fn scratch_terms(scratch: &mut Scratch, ix: &Index, q: &str) -> usize {
    let mut hits = Vec::new();
    ix.search(q, 1, scratch, |_| true, &mut hits);
    scratch.term_count()
}

#[test]
fn an_empty_index_finds_nothing() {
    let ix = Index::build(std::iter::empty());
    let mut hits = vec![(1, 1.0)];
    ix.search("pod", 5, &mut Scratch::default(), |_| true, &mut hits);
    assert!(hits.is_empty() && ix.is_empty());
}
