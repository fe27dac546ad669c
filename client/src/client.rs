//! The Rust producer API: schedule, look up, cancel and reschedule messages by
//! talking to Redis directly, through the same [`Store`] and Lua scripts the daemon
//! runs, so there is no HTTP hop and every guarantee is the daemon's own (idempotent
//! ids, Redis's clock for delays). A daemon must still run somewhere to deliver what
//! is scheduled, on the same Redis with the same `redis.prefix` and `redis.shards`:
//! build the producer from the daemon's configuration file to be sure
//! ([`ProducerOptions::from_config`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! # let redis = delayq_harness::RedisServer::start()?;
//! use std::time::Duration;
//!
//! use delayq_client::client::{Producer, Sent};
//! use delayq_client::store::Status;
//!
//! let producer = Producer::connect(&redis.url()).await?;
//!
//! // Due in an hour: stored until then, and delivered to "orders" by the daemon.
//! let sent = producer.send("orders", &[("order", "42"), ("event", "reminder")], Duration::from_secs(3600)).await?;
//! let Sent::Scheduled { id, .. } = sent else { panic!("a delay schedules") };
//! assert!(matches!(producer.get(id.as_str()).await?, Status::Scheduled(_)));
//!
//! // No delay: XADDed to the stream at once, as a plain producer would.
//! let now = producer.send("orders", &[("order", "43")], Duration::ZERO).await?;
//! assert!(matches!(now, Sent::Appended { .. }));
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use thiserror::Error;

use crate::config::Config;
use crate::message::{Due, InvalidMessage, Limits, MessageId, MessageKey, NewMessage, OwnFields};
use crate::secret::RedisUrl;
use crate::store::{
    Cancelled, KeyCancelled, KeyedMessage, PendingLayout, RecordLayout, RedisTls, Rescheduled,
    ScheduleMode, Scheduled, SentinelConfig, Status, Store, StoreConfig, StoreError,
};

/// Why a client call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The message or id breaks a rule; the text names it. Retrying will not help.
    #[error(transparent)]
    Invalid(#[from] InvalidMessage),
    /// Redis refused or could not be reached ([`StoreError::is_transient`] tells
    /// whether retrying may help).
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// What [`Producer::send`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// No delay: written to the stream at once, as this entry.
    Appended { entry_id: String },
    /// Stored, due at `due_ms` (epoch ms, Redis's clock).
    Scheduled { id: MessageId, due_ms: u64 },
}

/// Where the producer's Redis is and how the deployment lays out its keys.
#[derive(Clone, Debug)]
pub struct ProducerOptions {
    /// Shown redacted in `Debug`.
    pub redis_url: RedisUrl,
    /// For a `rediss://` URL: the CA to trust and a client certificate (the daemon's
    /// `redis.tls_*`); None trusts the system's CAs.
    pub tls: Option<RedisTls>,
    /// Find the master through Sentinel (the daemon's `redis.sentinel`).
    pub sentinel: Option<SentinelConfig>,
    /// Redis Cluster's seed nodes, host and port (the daemon's `redis.mode =
    /// "cluster"`: the URL's host, then `redis.nodes`); the URL then gives scheme,
    /// user and password.
    pub cluster: Option<Vec<(String, u16)>>,
    /// Replicas that must confirm each schedule (`WAIT`), and how long to wait for
    /// them (the daemon's `redis.min_replicas_acked`, `redis.replicas_ack_timeout`).
    pub replicas_acked: Option<(u32, Duration)>,
    /// Must equal the daemon's `redis.prefix`.
    pub prefix: String,
    /// Must equal the daemon's `redis.shards`: a message stored in a shard the daemon
    /// does not serve is never delivered. Redis keeps the count the deployment's
    /// messages are stored with, and connecting with another is refused. 0 takes the
    /// count Redis keeps (the default, 16, while it keeps none).
    pub shards: u16,
    /// Bounds every message is checked against (the daemon's `api.*` limits).
    pub limits: Limits,
    /// The fields the daemon adds to delivered entries (its `forwarder.id_field` and
    /// `forwarder.attempt_field`): a message may not carry them itself.
    pub own_fields: OwnFields,
    /// How long a cancellation stays on record (the daemon's `records.retention`).
    pub retention: Duration,
    /// How a cancellation is put on record (the daemon's `records.layout`).
    pub record_layout: RecordLayout,
    /// Whether a cancellation is listed among its stream's finished messages (the
    /// daemon's `records.finished_list`).
    pub finished_list: bool,
    /// How a message is stored (the daemon's `pending.layout`).
    pub pending_layout: PendingLayout,
    /// A Redis reply slower than this fails the call.
    pub timeout: Duration,
    /// Streams whose messages are kept apart when stored (the daemon's
    /// `streams.max_rate` streams; see [`Store::keep_apart`]).
    pub kept_apart: Vec<String>,
}

impl Default for ProducerOptions {
    /// The daemon's defaults, against a Redis on localhost.
    fn default() -> Self {
        let config = Config::from_toml("", std::iter::empty()).expect("the defaults are valid");
        ProducerOptions::from_config(&config)
    }
}

impl ProducerOptions {
    /// The options a daemon with this configuration uses, so both agree on the layout.
    ///
    /// ```
    /// let config = delayq_client::config::Config::from_toml("[redis]\nshards = 4", std::iter::empty())?;
    /// let options = delayq_client::client::ProducerOptions::from_config(&config);
    /// assert_eq!(options.shards, 4);
    /// # Ok::<(), delayq_client::config::ConfigError>(())
    /// ```
    pub fn from_config(config: &Config) -> Self {
        ProducerOptions {
            redis_url: config.redis.url.clone(),
            tls: config.redis.tls.clone(),
            sentinel: config.redis.sentinel.clone(),
            cluster: config.redis.cluster.clone(),
            replicas_acked: config.redis.replicas_acked,
            prefix: config.redis.prefix.clone(),
            shards: config.redis.shards,
            limits: config.api.limits.clone(),
            own_fields: config.own_fields(),
            retention: config.records.retention,
            record_layout: config.records.layout,
            finished_list: config.records.finished_list,
            pending_layout: config.pending.layout,
            timeout: config.redis.timeout,
            kept_apart: config.kept_apart(),
        }
    }
}

/// Schedules messages into a delayq deployment's Redis. Cheap to clone; clones share
/// one multiplexed connection.
#[derive(Clone)]
pub struct Producer {
    store: Store,
    limits: Limits,
    own_fields: OwnFields,
    retention: Duration,
}

impl Producer {
    /// Connects with the daemon's default layout (prefix `delayq`, 16 shards).
    pub async fn connect(redis_url: &str) -> Result<Producer> {
        Producer::with_options(ProducerOptions {
            redis_url: RedisUrl::new(redis_url),
            ..ProducerOptions::default()
        })
        .await
    }

    /// Connects with explicit options (failing fast if Redis is unreachable now).
    pub async fn with_options(options: ProducerOptions) -> Result<Producer> {
        let store = Store::connect(&StoreConfig {
            url: options.redis_url,
            tls: options.tls,
            sentinel: options.sentinel,
            cluster: options.cluster,
            replicas_acked: options.replicas_acked,
            prefix: options.prefix,
            shards: options.shards,
            response_timeout: options.timeout,
            connect_timeout: options.timeout,
            max_blocking_reads: 1,
            record_layout: options.record_layout,
            finished_list: options.finished_list,
            pending_layout: options.pending_layout,
            journal: false,
        })
        .await?;
        store.keep_apart(options.kept_apart);
        // A push straight into Redis would not be journaled.
        if store.journal_marker().await?.is_some() {
            return Err(StoreError::Unsupported(
                "this deployment journals its messages ([journal] on: Redis holds its marker): \
                 a push straight into Redis would not be journaled; push through delayq's API or inbox"
                    .to_owned(),
            )
            .into());
        }
        Ok(Producer {
            store,
            limits: options.limits,
            own_fields: options.own_fields,
            retention: options.retention,
        })
    }

    /// Sends `fields` to `stream` after `delay`: XADDs at once when the delay is zero,
    /// schedules (under a fresh id) otherwise.
    pub async fn send<K: AsRef<str>, V: AsRef<str>>(
        &self,
        stream: &str,
        fields: &[(K, V)],
        delay: Duration,
    ) -> Result<Sent> {
        let fields = fields
            .iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
            .collect();
        let msg = NewMessage::new(stream, fields, Due::In(delay));
        msg.validate(&self.limits, &self.own_fields)?;
        if delay.is_zero() {
            let entry_id = self.store.append(&msg.stream, &msg.fields).await?;
            return Ok(Sent::Appended { entry_id });
        }
        match self
            .store
            .schedule(&msg, ScheduleMode::New, self.limits.max_delay)
            .await?
        {
            Scheduled::Scheduled { due_ms } | Scheduled::Replaced { due_ms } => {
                Ok(Sent::Scheduled { id: msg.id, due_ms })
            }
            Scheduled::Duplicate { state, .. } => Err(StoreError::Reply(format!(
                "fresh id {} already known ({state})",
                msg.id
            ))
            .into()),
        }
    }

    /// Schedules a message with every option (own id for exactly-once submission,
    /// absolute due time, priority, ttl). A known id is answered as a duplicate and
    /// changes nothing, also after delivery (within the records' retention).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> anyhow::Result<()> {
    /// # let redis = delayq_harness::RedisServer::start()?;
    /// use std::time::Duration;
    ///
    /// use delayq_client::message::{Due, MessageId, NewMessage};
    /// use delayq_client::store::Scheduled;
    ///
    /// let producer = delayq_client::client::Producer::connect(&redis.url()).await?;
    /// let msg = NewMessage::payload("billing", "invoice 7 is due", Duration::from_secs(86_400))
    ///     .with_id(MessageId::parse("invoice-7-reminder")?)
    ///     .with_priority(5)
    ///     .with_ttl(Some(Duration::from_secs(600)));
    /// assert!(matches!(producer.schedule(&msg).await?, Scheduled::Scheduled { .. }));
    /// // A retry of the same id is recognised.
    /// assert!(matches!(producer.schedule(&msg).await?, Scheduled::Duplicate { .. }));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn schedule(&self, msg: &NewMessage) -> Result<Scheduled> {
        msg.validate(&self.limits, &self.own_fields)?;
        Ok(self
            .store
            .schedule(msg, ScheduleMode::New, self.limits.max_delay)
            .await?)
    }

    /// A message's state: scheduled (with its details), or how it ended (within the
    /// records' retention), or unknown.
    pub async fn get(&self, id: &str) -> Result<Status> {
        Ok(self.store.get(&MessageId::parse(id)?).await?)
    }

    /// Withdraws a scheduled message.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> anyhow::Result<()> {
    /// # let redis = delayq_harness::RedisServer::start()?;
    /// use std::time::Duration;
    ///
    /// use delayq_client::client::{Producer, Sent};
    /// use delayq_client::store::{Cancelled, RecordState, Status};
    ///
    /// let producer = Producer::connect(&redis.url()).await?;
    /// let Sent::Scheduled { id, .. } = producer.send("orders", &[("order", "42")], Duration::from_secs(60)).await? else {
    ///     unreachable!()
    /// };
    /// assert_eq!(producer.cancel(id.as_str()).await?, Cancelled::Cancelled);
    /// assert!(matches!(producer.get(id.as_str()).await?, Status::Done(r) if r.state == RecordState::Cancelled));
    /// assert_eq!(producer.cancel("never-sent").await?, Cancelled::Unknown);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cancel(&self, id: &str) -> Result<Cancelled> {
        Ok(self
            .store
            .cancel(&MessageId::parse(id)?, self.retention)
            .await?)
    }

    /// Withdraws every scheduled message pushed to `stream` with business `key`
    /// (one atomic step per shard); again, it cancels nothing more.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> anyhow::Result<()> {
    /// # let redis = delayq_harness::RedisServer::start()?;
    /// use std::time::Duration;
    ///
    /// use delayq_client::client::Producer;
    /// use delayq_client::message::{MessageKey, NewMessage};
    ///
    /// let producer = Producer::connect(&redis.url()).await?;
    /// let order = MessageKey::parse("order-42")?;
    /// for (text, minutes) in [("service notice", 20), ("rating request", 60)] {
    ///     let msg = NewMessage::payload("orders", text, Duration::from_secs(minutes * 60))
    ///         .with_key(Some(order.clone()));
    ///     producer.schedule(&msg).await?;
    /// }
    /// assert_eq!(producer.key_messages("orders", "order-42").await?.len(), 2);
    /// let done = producer.cancel_key("orders", "order-42").await?;
    /// assert_eq!((done.cancelled.len(), done.delivered), (2, 0));
    /// assert!(producer.cancel_key("orders", "order-42").await?.cancelled.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cancel_key(&self, stream: &str, key: &str) -> Result<KeyCancelled> {
        let key = MessageKey::parse(key)?;
        Ok(self.store.cancel_key(stream, &key, self.retention).await?)
    }

    /// The messages pushed to `stream` with business `key`, pending or still on
    /// record, in no particular order.
    pub async fn key_messages(&self, stream: &str, key: &str) -> Result<Vec<KeyedMessage>> {
        let key = MessageKey::parse(key)?;
        Ok(self.store.key_messages(stream, &key).await?)
    }

    /// Moves a scheduled message to a new due time; its fields, priority and ttl stay.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> anyhow::Result<()> {
    /// # let redis = delayq_harness::RedisServer::start()?;
    /// use std::time::Duration;
    ///
    /// use delayq_client::client::{Producer, Sent};
    /// use delayq_client::message::Due;
    /// use delayq_client::store::Rescheduled;
    ///
    /// let producer = Producer::connect(&redis.url()).await?;
    /// let Sent::Scheduled { id, due_ms } = producer.send("orders", &[("order", "42")], Duration::from_secs(60)).await? else {
    ///     unreachable!()
    /// };
    /// let Rescheduled::Rescheduled { due_ms: later, .. } = producer.reschedule(id.as_str(), Due::In(Duration::from_secs(3600))).await? else {
    ///     unreachable!()
    /// };
    /// assert!(later >= due_ms + 3_540_000);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reschedule(&self, id: &str, due: Due) -> Result<Rescheduled> {
        let id = MessageId::parse(id)?;
        self.limits.check_delay(due)?;
        Ok(self
            .store
            .reschedule(&id, due, self.limits.max_delay)
            .await?)
    }

    /// The store underneath, for what this API does not cover.
    pub fn store(&self) -> &Store {
        &self.store
    }
}
