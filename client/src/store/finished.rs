//! A stream's finished messages, newest first: each shard's list of the ids that
//! reached a terminal state (see `lua/prelude/35-finished.lua`), read a page at a time
//! and merged by their finish times.

use std::fmt;

use super::*;

/// How many ids one shard looks at for one page, at most: a page of messages in a
/// state that few reach stops there, and the next page goes on from where it stopped.
const LOOK_PER_PAGE: usize = 10_000;

/// One finished message, as its record says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedMessage {
    pub id: String,
    pub record: Record,
    /// When attempt 1 reached the stream, for a message delivered on a later attempt
    /// (or dead after one).
    pub first_delivered_ms: Option<u64>,
}

/// Where the next page goes on, per shard still to read: the place of its next id,
/// and the latest finish time it may show (an id finished again since shows where it
/// finished last). Written as `shard:place:ms` joined by commas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FinishedCursor(Vec<ShardPlace>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShardPlace {
    shard: u16,
    place: u64,
    ceiling: Option<u64>,
}

impl FinishedCursor {
    /// A cursor as `Display` writes it; None for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut places = Vec::new();
        for part in text.split(',') {
            let mut it = part.split(':');
            let shard = it.next()?.parse().ok()?;
            let place = it.next()?.parse().ok()?;
            let ceiling = match it.next()? {
                "" => None,
                ms => Some(ms.parse().ok()?),
            };
            if it.next().is_some() || places.iter().any(|p: &ShardPlace| p.shard == shard) {
                return None;
            }
            places.push(ShardPlace {
                shard,
                place,
                ceiling,
            });
        }
        Some(FinishedCursor(places))
    }
}

impl fmt::Display for FinishedCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let ceiling = p.ceiling.map(|ms| ms.to_string()).unwrap_or_default();
            write!(f, "{sep}{}:{}:{ceiling}", p.shard, p.place)?;
        }
        Ok(())
    }
}

/// A page of a stream's finished messages, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FinishedPage {
    pub messages: Vec<FinishedMessage>,
    /// Where the next page starts; None when this one reached the oldest on record.
    pub next: Option<FinishedCursor>,
}

/// One shard's answer for a page.
struct ShardPage {
    asked: ShardAsk,
    /// Its messages, newest first, each with its place.
    found: Vec<(FinishedMessage, u64)>,
    /// The place of its next id; None when it reached its list's start.
    next: Option<u64>,
    /// The finish time of the last id it looked at.
    last_at: Option<u64>,
}

#[derive(Clone, Copy)]
struct ShardAsk {
    shard: u16,
    place: Option<u64>,
    ceiling: Option<u64>,
}

impl Store {
    /// Up to `limit` messages to `stream` that finished while records are kept, in
    /// one of `states` (any when empty), newest first, from `after` on (the `next`
    /// of the page before; None for the newest).
    pub async fn finished(
        &self,
        stream: &str,
        after: Option<&FinishedCursor>,
        limit: usize,
        states: &[RecordState],
    ) -> Result<FinishedPage> {
        let asks: Vec<ShardAsk> = match after {
            Some(cursor) => cursor
                .0
                .iter()
                .map(|p| ShardAsk {
                    shard: p.shard,
                    place: Some(p.place),
                    ceiling: p.ceiling,
                })
                .collect(),
            None => self
                .shards_of_stream(stream)
                .await?
                .into_iter()
                .map(|shard| ShardAsk {
                    shard,
                    place: None,
                    ceiling: None,
                })
                .collect(),
        };
        let states = states
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        let mut pages = Vec::with_capacity(asks.len());
        // A read changes nothing: the shards are asked 64 at a time.
        for chunk in asks.chunks(64) {
            let asked = chunk
                .iter()
                .map(|&ask| self.finished_in(ask, stream, limit, &states));
            pages.extend(futures::future::try_join_all(asked).await?);
        }
        Ok(merged(pages, limit))
    }

    async fn finished_in(
        &self,
        asked: ShardAsk,
        stream: &str,
        limit: usize,
        states: &str,
    ) -> Result<ShardPage> {
        let k = self.keys.shard(asked.shard);
        let reply: Value = self
            .scripts
            .finished
            .key(&k.records)
            .arg(stream)
            .arg(asked.place.map(|p| p.to_string()).unwrap_or_default())
            .arg(asked.ceiling.map(|ms| ms.to_string()).unwrap_or_default())
            .arg(limit)
            .arg(states)
            .arg(LOOK_PER_PAGE)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::from_script)?;
        let items = array(reply)?;
        if items.len() < 2 || (items.len() - 2) % 9 != 0 {
            return Err(StoreError::Reply(format!(
                "finished said {} values",
                items.len()
            )));
        }
        let number = |i: usize| number_text_at(&items, i);
        let mut found = Vec::with_capacity((items.len() - 2) / 9);
        for i in (2..items.len()).step_by(9) {
            let said = string_at(&items, i + 1)?;
            let state = RecordState::parse(&said)
                .ok_or_else(|| StoreError::Reply(format!("finished said {said:?}")))?;
            let entry = string_at(&items, i + 3)?;
            let written_to = string_at(&items, i + 6)?;
            let record = Record {
                state,
                stream: (!written_to.is_empty()).then_some(written_to),
                entry_id: (!entry.is_empty()).then_some(entry),
                at_ms: int_at(&items, i + 2)?,
                attempt: number(i + 4)?.unwrap_or(0),
                late_ms: number(i + 8)?,
            };
            let message = FinishedMessage {
                id: string_at(&items, i)?,
                record,
                first_delivered_ms: number(i + 5)?,
            };
            found.push((message, int_at(&items, i + 7)?));
        }
        Ok(ShardPage {
            asked,
            found,
            next: number(0)?,
            last_at: number(1)?,
        })
    }
}

/// The shards' answers as one page: the newest `limit` of them, but none older than
/// what a shard that stopped short (it looked at its most ids and found fewer than
/// `limit`) has not looked at yet; and where each shard goes on.
fn merged(pages: Vec<ShardPage>, limit: usize) -> FinishedPage {
    // Nothing older than the last finish time a shard that stopped short looked at.
    let floor = pages
        .iter()
        .filter(|p| p.next.is_some() && p.found.len() < limit)
        .map(|p| p.last_at.or(p.asked.ceiling).unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0);
    let mut all: Vec<(u16, u64, &FinishedMessage)> = pages
        .iter()
        .flat_map(|p| p.found.iter().map(|(m, place)| (p.asked.shard, *place, m)))
        .collect();
    all.sort_by(|a, b| (b.2.record.at_ms, a.0, b.1).cmp(&(a.2.record.at_ms, b.0, a.1)));
    let taken: Vec<(u16, u64, &FinishedMessage)> = all
        .into_iter()
        .take_while(|(_, _, m)| m.record.at_ms >= floor)
        .take(limit)
        .collect();
    let mut places = Vec::new();
    for page in &pages {
        let mine: Vec<&(u16, u64, &FinishedMessage)> =
            taken.iter().filter(|t| t.0 == page.asked.shard).collect();
        let (place, ceiling) = if mine.len() == page.found.len() {
            // All it found is shown: it goes on from where it stopped looking.
            match page.next {
                Some(next) => (next, page.last_at.or(page.asked.ceiling)),
                None => continue,
            }
        } else {
            // From after the last one shown (a shard's are taken in its own order).
            match mine.last() {
                Some(last) if last.1 > 0 => (last.1 - 1, Some(last.2.record.at_ms)),
                Some(_) => continue,
                None => match page.asked.place {
                    Some(place) => (place, page.asked.ceiling),
                    None => (page.found[0].1, None),
                },
            }
        };
        places.push(ShardPlace {
            shard: page.asked.shard,
            place,
            ceiling,
        });
    }
    let messages = taken.into_iter().map(|(_, _, m)| m.clone()).collect();
    FinishedPage {
        messages,
        next: (!places.is_empty()).then_some(FinishedCursor(places)),
    }
}
