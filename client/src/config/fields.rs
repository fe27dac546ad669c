//! The fields the forwarder adds to each delivered entry, as a deployment names
//! them: the id's and the attempt's everywhere, the business key's per stream.

use super::{Config, ForwarderConfig, StreamsConfig};
use crate::message::OwnFields;

impl Config {
    /// The fields a daemon with this configuration adds to delivered entries,
    /// which no message may carry itself.
    pub fn own_fields(&self) -> OwnFields {
        own_fields(&self.forwarder, &self.streams)
    }

    /// The field that carries a message's business key on `stream`'s entries
    /// (`streams.key_field.<stream>`, else `forwarder.key_field`).
    pub fn key_field_for(&self, stream: &str) -> Option<&str> {
        crate::message::key_field_of(
            self.forwarder.key_field.as_deref(),
            &self.streams.key_field,
            stream,
        )
    }
}

/// [`Config::own_fields`] from the two sections that name them.
pub(super) fn own_fields(forwarder: &ForwarderConfig, streams: &StreamsConfig) -> OwnFields {
    OwnFields {
        id_field: forwarder.id_field.clone(),
        attempt_field: forwarder.attempt_field.clone(),
        key_field: forwarder.key_field.clone(),
        stream_key_fields: streams.key_field.clone(),
    }
}
