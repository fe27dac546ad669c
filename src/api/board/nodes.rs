//! The nodes and the leadership history, as the dashboard's Nodes page shows them.

use super::*;

/// The nodes that ever registered (forgotten a day after they were last seen).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Nodes {
    nodes: Vec<NodeView>,
    now_ms: u64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct NodeView {
    node_id: String,
    /// `leader`, `standby`, or `gone` (stopped, or silent for 10 s).
    role: String,
    #[schema(required)]
    epoch: Option<u64>,
    address: String,
    version: String,
    started_at_ms: u64,
    last_seen_ms: u64,
}

/// Every node, its role, address, version, start and last sign of life
#[utoipa::path(get, path = "/v1/nodes", operation_id = "nodes",
    responses(
        (status = 200, description = "the nodes", body = Nodes),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn nodes(State(state): State<AppState>) -> Result<Json<Nodes>, ApiError> {
    let now = now_ms();
    let records = state.store.nodes(now).await?;
    let nodes = records
        .into_iter()
        .map(|n| {
            let gone = is_gone(&n, now);
            NodeView {
                role: match (gone, n.leader) {
                    (true, _) => "gone",
                    (false, true) => "leader",
                    (false, false) => "standby",
                }
                .to_owned(),
                epoch: n.epoch.filter(|_| !gone),
                node_id: n.node_id,
                address: n.address,
                version: n.version,
                started_at_ms: n.started_at_ms,
                last_seen_ms: n.last_seen_ms,
            }
        })
        .collect();
    Ok(Json(Nodes { nodes, now_ms: now }))
}

/// The leadership terms kept (the newest 200), newest first.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct History {
    terms: Vec<TermView>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct TermView {
    node_id: String,
    epoch: u64,
    /// The election group (`election.mode = "per_shard"`).
    #[schema(required)]
    group: Option<u16>,
    from_ms: u64,
    /// Null while it lasts.
    #[schema(required)]
    to_ms: Option<u64>,
    /// `resigned`, `switchover`, `shut down`, `lease lost`, `fenced`, `master moved`
    /// (as its leader said), `taken over` (a later term began without a word from
    /// it: a crash or a cut), `node gone` (its node stopped answering, and no term
    /// followed yet); null while it lasts.
    #[schema(required)]
    ended: Option<String>,
}

/// Who led, from when to when, and why each term ended
#[utoipa::path(get, path = "/v1/leadership/history", operation_id = "leadershipHistory",
    responses(
        (status = 200, description = "the terms, newest first", body = History),
        (status = 503, description = "Redis unavailable", body = ErrorBody),
    ),
    security(("bearer" = [])))]
pub async fn history(State(state): State<AppState>) -> Result<Json<History>, ApiError> {
    let now = now_ms();
    let (terms, nodes) = tokio::try_join!(state.store.terms(), state.store.nodes(now))?;
    let gone: BTreeMap<&str, u64> = nodes
        .iter()
        .filter(|n| is_gone(n, now))
        .map(|n| (n.node_id.as_str(), n.last_seen_ms))
        .collect();
    let views = term_views(terms, &gone);
    Ok(Json(History { terms: views }))
}

/// The terms as shown (newest first, as `terms` come): a term its leader did not
/// end is `taken over` from the start of the next term of its group, or `node
/// gone` (at its node's last sign of life) when its node is `gone` (node id → last
/// seen) and no term followed.
pub(super) fn term_views(terms: Vec<TermRecord>, gone: &BTreeMap<&str, u64>) -> Vec<TermView> {
    // Newest first: the term after each is the one seen last of its group.
    let mut later: BTreeMap<Option<u16>, u64> = BTreeMap::new();
    let mut views = Vec::with_capacity(terms.len());
    for t in terms {
        let (to_ms, ended) = match (t.to_ms, t.ended) {
            (Some(to), Some(why)) => (Some(to), Some(why)),
            (to, why) => match later.get(&t.group) {
                Some(&next) => (
                    Some(to.unwrap_or(next)),
                    Some(why.unwrap_or_else(|| "taken over".into())),
                ),
                None => match gone.get(t.node_id.as_str()) {
                    Some(&seen) => (Some(seen), Some("node gone".into())),
                    None => (None, None),
                },
            },
        };
        later.insert(t.group, t.from_ms);
        views.push(TermView {
            node_id: t.node_id,
            epoch: t.epoch,
            group: t.group,
            from_ms: t.from_ms,
            to_ms,
            ended,
        });
    }
    views
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(
        node: &str,
        epoch: u64,
        group: Option<u16>,
        from: u64,
        end: Option<(u64, &str)>,
    ) -> TermRecord {
        TermRecord {
            node_id: node.into(),
            epoch,
            group,
            from_ms: from,
            to_ms: end.map(|(t, _)| t),
            ended: end.map(|(_, why)| why.into()),
        }
    }

    fn shown(views: &[TermView]) -> Vec<(String, u64, Option<u64>, Option<String>)> {
        views
            .iter()
            .map(|v| (v.node_id.clone(), v.epoch, v.to_ms, v.ended.clone()))
            .collect()
    }

    #[test]
    fn terms_end_as_their_leader_said_or_as_what_came_after_them() {
        let gone = BTreeMap::from([("c", 950)]);
        type Shown<'a> = (&'a str, u64, Option<u64>, Option<&'a str>);
        let cases: Vec<(Vec<TermRecord>, Vec<Shown>)> = vec![
            // Ended in order: kept as said.
            (
                vec![term("a", 2, None, 100, Some((200, "resigned")))],
                vec![("a", 2, Some(200), Some("resigned"))],
            ),
            // Still leading.
            (
                vec![term("a", 2, None, 100, None)],
                vec![("a", 2, None, None)],
            ),
            // Silent, and a later term began: taken over at its start.
            (
                vec![term("b", 5, None, 300, None), term("a", 2, None, 100, None)],
                vec![
                    ("b", 5, None, None),
                    ("a", 2, Some(300), Some("taken over")),
                ],
            ),
            // Silent, its node gone, nobody followed: ended with its node.
            (
                vec![term("c", 7, None, 900, None)],
                vec![("c", 7, Some(950), Some("node gone"))],
            ),
            // Groups follow each other only within themselves.
            (
                vec![
                    term("b", 9, Some(1), 500, None),
                    term("a", 8, Some(0), 400, None),
                ],
                vec![("b", 9, None, None), ("a", 8, None, None)],
            ),
        ];
        for (terms, want) in cases {
            let want: Vec<_> = want
                .into_iter()
                .map(|(n, e, to, why)| (n.to_owned(), e, to, why.map(str::to_owned)))
                .collect();
            assert_eq!(shown(&term_views(terms.clone(), &gone)), want, "{terms:?}");
        }
    }
}
