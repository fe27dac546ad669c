//! Exactly once, counted: the ids a test expects against those that arrived, as
//! lost, duplicated and never expected ones, with an assertion that names a few
//! of each. `Deliveries` waits for a test's messages in their streams and tallies
//! them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use super::{Entry, within};

/// After the last expected id arrived, how long a late duplicate has to show.
const SETTLE: Duration = Duration::from_millis(300);

/// How often each expected id arrived, and what arrived that was never expected.
#[derive(Debug, Default)]
pub struct Tally {
    pub expected: usize,
    pub arrived: usize,
    pub lost: Vec<String>,
    /// Expected ids that arrived more than once, with how many times.
    pub duplicated: Vec<(String, usize)>,
    /// Ids that arrived, with how many times, but were never expected.
    pub unexpected: Vec<(String, usize)>,
}

impl Tally {
    pub fn count<E, A>(expected: E, arrived: A) -> Tally
    where
        E: IntoIterator,
        E::Item: AsRef<str>,
        A: IntoIterator,
        A::Item: AsRef<str>,
    {
        let expected: BTreeSet<String> = expected
            .into_iter()
            .map(|id| id.as_ref().to_owned())
            .collect();
        let mut times: BTreeMap<String, usize> = BTreeMap::new();
        for id in arrived {
            *times.entry(id.as_ref().to_owned()).or_default() += 1;
        }
        Tally {
            expected: expected.len(),
            arrived: times.values().sum(),
            lost: expected
                .iter()
                .filter(|id| !times.contains_key(*id))
                .cloned()
                .collect(),
            duplicated: times
                .iter()
                .filter(|(id, n)| **n > 1 && expected.contains(*id))
                .map(|(id, n)| (id.clone(), *n))
                .collect(),
            unexpected: times
                .into_iter()
                .filter(|(id, _)| !expected.contains(id))
                .collect(),
        }
    }

    /// The entries by their `delayq-id` (`?` for one without).
    pub fn of_ids<E>(expected: E, entries: &[Entry]) -> Tally
    where
        E: IntoIterator,
        E::Item: AsRef<str>,
    {
        Tally::count(
            expected,
            entries.iter().map(|e| e.get("delayq-id").unwrap_or("?")),
        )
    }

    pub fn is_exact(&self) -> bool {
        self.lost.is_empty() && self.duplicated.is_empty() && self.unexpected.is_empty()
    }

    /// One line for each id that did not arrive exactly once.
    pub fn problems(&self) -> Vec<String> {
        let lost = self.lost.iter().map(|id| format!("{id}: never arrived"));
        let duplicated = self
            .duplicated
            .iter()
            .map(|(id, n)| format!("{id}: arrived {n} times"));
        let unexpected = self
            .unexpected
            .iter()
            .map(|(id, n)| format!("{id}: never expected, arrived {n} times"));
        lost.chain(duplicated).chain(unexpected).collect()
    }

    /// Panics unless every expected id arrived once and nothing else did, naming
    /// what went wrong, then `context` (logs, a seed).
    #[track_caller]
    pub fn assert_exact(&self, context: &str) {
        assert!(self.is_exact(), "not exactly once: {self}\n{context}");
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn some<T: fmt::Debug>(items: &[T]) -> String {
            format!("{:?}", &items[..items.len().min(5)])
        }
        write!(
            f,
            "{} expected, {} arrived: {} lost (e.g. {}), {} more than once (e.g. {}), {} never expected (e.g. {})",
            self.expected,
            self.arrived,
            self.lost.len(),
            some(&self.lost),
            self.duplicated.len(),
            some(&self.duplicated),
            self.unexpected.len(),
            some(&self.unexpected),
        )
    }
}

/// The streams a test's messages are delivered to, on the Redis at a URL; read over
/// a connection of its own, made again when Redis restarts meanwhile (until then
/// the reading only waits).
pub struct Deliveries {
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    streams: Vec<String>,
}

impl Deliveries {
    pub fn new(redis_url: &str, streams: &[&str]) -> Deliveries {
        Deliveries {
            client: redis::Client::open(redis_url).expect("a Redis URL"),
            conn: Mutex::new(None),
            streams: streams.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// `read` on the connection; None (and a new connection next time) when Redis
    /// does not answer.
    fn read<T>(
        &self,
        read: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Option<T> {
        let mut cached = self.conn.lock().expect("the connection");
        if cached.is_none() {
            *cached = self
                .client
                .get_connection_with_timeout(Duration::from_secs(1))
                .ok();
        }
        let answer = read(cached.as_mut()?);
        if answer.is_err() {
            *cached = None;
        }
        answer.ok()
    }

    /// How many entries the streams hold; None while Redis does not answer.
    pub fn len(&self) -> Option<usize> {
        self.read(|conn| {
            let mut total = 0;
            for s in &self.streams {
                total += redis::cmd("XLEN").arg(s).query::<usize>(conn)?;
            }
            Ok(total)
        })
    }

    /// Every entry of the streams, stream by stream; None while Redis does not answer.
    pub fn try_entries(&self) -> Option<Vec<Entry>> {
        // A quick question first: `entries` panics on an error.
        self.len()?;
        self.read(|conn| {
            Ok(self
                .streams
                .iter()
                .flat_map(|s| super::entries(conn, s))
                .collect())
        })
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.try_entries().expect("Redis answers")
    }

    /// Waits until every `expected` id arrived (at most `timeout` × patience), then
    /// watches a little longer so that a late duplicate shows; the tally and the
    /// entries at the end. Asserting is the caller's, with what it knows to add.
    pub async fn exactly_once<E>(&self, expected: E, timeout: Duration) -> (Tally, Vec<Entry>)
    where
        E: IntoIterator,
        E::Item: AsRef<str>,
    {
        let expected: Vec<String> = expected
            .into_iter()
            .map(|id| id.as_ref().to_owned())
            .collect();
        let all = within(timeout, || {
            let arrived = self.len().filter(|n| *n >= expected.len()).and_then(|_| {
                let entries = self.try_entries()?;
                Tally::of_ids(&expected, &entries)
                    .lost
                    .is_empty()
                    .then_some(())
            });
            std::future::ready(arrived)
        })
        .await;
        if all.is_some() {
            let settled = self.len();
            within(SETTLE, || {
                std::future::ready((self.len() != settled).then_some(()))
            })
            .await;
        }
        let entries = self.entries();
        (Tally::of_ids(&expected, &entries), entries)
    }
}
