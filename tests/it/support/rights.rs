//! The Redis user of docs/redis-rights.md, made from the rule's text as written
//! there: the tests that run a daemon as that user prove the rule enough.

use std::path::{Path, PathBuf};

use delayq_harness::RedisServer;

/// The words of the docs' `ACL SETUSER` rule, with `PASSWORD` replaced by
/// `password` and each word named in `words` by its replacement (the example's
/// prefix and streams by a test's own).
pub fn documented_rule(words: &[(&str, String)], password: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(super::repo().join("docs/redis-rights.md"))
        .expect("read docs/redis-rights.md");
    let (_, after) = doc
        .split_once("<!-- redis-rule -->")
        .expect("docs/redis-rights.md marks its rule");
    let line = after
        .lines()
        .find(|l| l.starts_with("ACL SETUSER"))
        .expect("the rule's line");
    line.split_whitespace()
        .map(|w| match w {
            ">PASSWORD" => format!(">{password}"),
            w => words
                .iter()
                .find(|(from, _)| *from == w)
                .map_or_else(|| w.to_owned(), |(_, to)| to.clone()),
        })
        .collect()
}

/// Creates the documented user `delayq` on each of `nodes` (ACL users are each
/// node's own) for target `stream`, optionally with some of the rule's words
/// left out; its password goes to a file in `dir`, which is returned.
pub fn documented_user(
    nodes: &[&RedisServer],
    stream: &str,
    without: &[&str],
    dir: &Path,
) -> PathBuf {
    let words = [
        ("~orders", format!("~{stream}")),
        ("~orders:dead", format!("~{stream}:dead")),
    ];
    documented_user_with(nodes, &words, without, dir)
}

/// [`documented_user`] with the rule's words replaced as `words` says.
pub fn documented_user_with(
    nodes: &[&RedisServer],
    words: &[(&str, String)],
    without: &[&str],
    dir: &Path,
) -> PathBuf {
    let password = "rule-s3cret";
    let rule: Vec<String> = documented_rule(words, password)
        .into_iter()
        .filter(|w| !without.contains(&w.as_str()))
        .collect();
    assert_eq!(rule[..3], ["ACL", "SETUSER", "delayq"], "{rule:?}");
    for node in nodes {
        let () = redis::cmd("ACL")
            .arg(&rule[1..])
            .query(&mut node.client())
            .unwrap_or_else(|e| panic!("{rule:?}: {e}"));
    }
    let file = dir.join("redis-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    file
}
