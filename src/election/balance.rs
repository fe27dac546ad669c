//! Spreading election groups over the nodes (`election.mode = "per_shard"`).
//!
//! Every node campaigns in every group's election, so a group whose leader dies
//! goes to the next node in line as in the single-leader mode. Spreading is done
//! by resigning: every [`EVERY`], each node reads every group's candidates from
//! etcd (the keys under the group's prefix, oldest first: the first leads). When
//! the node leading the most groups leads at least two more than the one leading
//! the fewest, that node (the one with the greatest id among those leading the
//! most, so that nodes reading the same candidates agree) resigns one group, the
//! one whose next candidate leads the fewest, and lets the election settle for
//! [`SETTLE`] before judging again. A resignation is the planned switchover: the
//! next candidate takes over within milliseconds, its epoch raises the fences of
//! the group's shards, and the resigning node's term ends before it resigns, so
//! no group is ever moved by two nodes. A group is never resigned while no other
//! node stands in line for it.

use std::collections::BTreeMap;

use super::observe::campaigners;
use super::*;
use crate::leadership::Group;

/// How often a node looks at the spread.
const EVERY: Duration = Duration::from_millis(500);
/// After a resignation, how long to let the election move on before judging
/// again: longer than the resigning node stays out of the race.
const SETTLE: Duration = Duration::from_millis(1_500);

/// The election prefix of group `group` under `prefix`. A sibling of the single
/// mode's prefix (`<prefix>-group-<g>`), never beneath it, so the two modes' keys
/// cannot be mistaken for each other.
fn group_prefix(prefix: &str, group: impl std::fmt::Display) -> String {
    format!("{prefix}-group-{group}")
}

/// `etcd` with the election prefix of group `group`: what that group's election
/// (and `view` of it) runs with.
pub fn group_config(etcd: &EtcdConfig, group: u16) -> EtcdConfig {
    EtcdConfig {
        election_prefix: group_prefix(&etcd.election_prefix, group),
        ..etcd.clone()
    }
}

/// Resigns groups this node leads beyond its share, until `cancel`.
pub async fn balance(
    config: EtcdConfig,
    node_id: String,
    groups: Vec<Group>,
    cancel: CancellationToken,
) {
    let client = loop {
        match connect(&config).await {
            Ok(client) => break client,
            Err(_) => tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(EVERY) => {}
            },
        }
    };
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        let Some(lines) = candidates(&client, &config, &groups).await else {
            continue;
        };
        let led_here = |g: usize| groups[g].leadership.current().is_leader();
        let Some(group) = to_resign(&node_id, &lines, led_here) else {
            continue;
        };
        tracing::info!(
            group = groups[group].group,
            shards = ?groups[group].shards,
            "leading more election groups than my share; resigning one"
        );
        metrics::counter!(m::GROUPS_RESIGNED).increment(1);
        groups[group].leadership.step_down(StepDown::Resign);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(SETTLE) => {}
        }
    }
}

/// Each group's candidates, oldest first (the first leads), each node once, read
/// in one request for every group; None when etcd does not answer.
async fn candidates(
    client: &Client,
    config: &EtcdConfig,
    groups: &[Group],
) -> Option<Vec<Vec<String>>> {
    // Every group's keys, `<prefix>-group-<g>/<lease>`, share this prefix.
    let all = group_prefix(&config.election_prefix, "");
    let read = campaigners(client, config, &all, None).await.ok()?;
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); groups.len()];
    for kv in read.kvs() {
        let group = kv
            .key()
            .strip_prefix(all.as_bytes())
            .and_then(|rest| rest.split(|b| *b == b'/').next())
            .and_then(|g| std::str::from_utf8(g).ok()?.parse::<usize>().ok());
        let Some(line) = group.and_then(|g| lines.get_mut(g)) else {
            continue;
        };
        let node = LeaderValue::parse(kv.value()).node_id;
        if !line.contains(&node) {
            line.push(node);
        }
    }
    Some(lines)
}

/// The group (an index into `lines`) that node `me` should resign now, if any:
/// `lines` holds each group's candidates, first the leader; `led_here` says
/// whether this node's own elector still leads a group (etcd's view may lag).
fn to_resign(me: &str, lines: &[Vec<String>], led_here: impl Fn(usize) -> bool) -> Option<usize> {
    let mut leads: BTreeMap<&str, usize> = BTreeMap::new();
    for line in lines {
        for node in line {
            leads.entry(node.as_str()).or_default();
        }
        if let Some(leader) = line.first() {
            *leads.get_mut(leader.as_str()).expect("entered above") += 1;
        }
    }
    let most = *leads.values().max()?;
    let fewest = *leads.values().min()?;
    if most < fewest + 2 {
        return None;
    }
    // The greatest id among those leading the most: every node reading the same
    // lines picks the same one.
    let resigner = leads
        .iter()
        .filter(|(_, n)| **n == most)
        .map(|(node, _)| *node)
        .next_back()?;
    if resigner != me {
        return None;
    }
    lines
        .iter()
        .enumerate()
        .filter(|(g, line)| line.first().is_some_and(|l| l == me) && led_here(*g))
        .filter_map(|(g, line)| line.get(1).map(|next| (leads[next.as_str()], g)))
        .min()
        .map(|(_, g)| g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(spec: &[&str]) -> Vec<Vec<String>> {
        spec.iter()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    fn case(me: &str, spec: &[&str]) -> Option<usize> {
        to_resign(me, &lines(spec), |_| true)
    }

    #[test]
    fn the_busiest_node_resigns_toward_the_idlest() {
        // a leads 3, b 1, c 0: a resigns the group whose next in line is c.
        let spec = ["a b c", "a c b", "a b c", "b a c"];
        assert_eq!(case("a", &spec), Some(1));
        assert_eq!(case("b", &spec), None);
        assert_eq!(case("c", &spec), None);
    }

    #[test]
    fn a_spread_within_one_stays() {
        assert_eq!(case("a", &["a b c", "b a c", "c a b", "a b c"]), None);
        assert_eq!(case("a", &["a b", "b a", "a b"]), None);
        assert_eq!(case("a", &["a"]), None);
    }

    #[test]
    fn ties_go_to_the_greatest_id() {
        // a and b lead 2 each, c none: only b resigns.
        let spec = ["a b c", "a c b", "b a c", "b c a"];
        assert_eq!(case("a", &spec), None);
        assert_eq!(case("b", &spec), Some(3));
    }

    #[test]
    fn a_newcomer_in_line_counts_even_before_it_leads() {
        // d stands in every line but leads nothing yet.
        let spec = ["a b d", "a b d", "b a d", "b a d"];
        assert_eq!(case("b", &spec), Some(2));
    }

    #[test]
    fn never_a_group_nobody_else_waits_for_or_one_no_longer_led_here() {
        assert_eq!(case("a", &["a", "a", "a b"]), Some(2));
        assert_eq!(case("a", &["a", "a", "a"]), None);
        assert_eq!(
            to_resign("a", &lines(&["a b", "a b", "a b"]), |g| g == 1),
            Some(1)
        );
        assert_eq!(
            to_resign("a", &lines(&["a b", "a b", "a b"]), |_| false),
            None
        );
    }
}
