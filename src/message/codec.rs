//! How a message crosses into the store's scripts: a new message as the arguments
//! of a schedule call. The Lua side is the store's prelude (`read_new_message`).

use redis::{RedisWrite, ToRedisArgs};

use super::{Due, NewMessage};

/// One script argument, borrowed from the message it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Number(u64),
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        match self {
            Arg::Text(text) => text.write_redis_args(out),
            Arg::Number(n) => n.write_redis_args(out),
        }
    }
}

impl Due {
    /// The due time as the scripts take it: its kind (`in`: the value is a delay in
    /// ms; `at`: epoch ms) and its value.
    pub(crate) fn script_args(self) -> [Arg<'static>; 2] {
        let kind = match self {
            Due::In(_) => "in",
            Due::At(_) => "at",
        };
        [Arg::Text(kind), Arg::Number(self.as_ms())]
    }
}

impl NewMessage {
    /// This message as a schedule call carries it, in the layout the prelude's
    /// `read_new_message` reads: id, due kind, due value, priority, ttl ms (0 = none),
    /// stream, n, then the n field/value pairs.
    pub(crate) fn script_args(&self) -> impl Iterator<Item = Arg<'_>> {
        let [due_kind, due_value] = self.due.script_args();
        let ttl_ms = self.ttl.map_or(0, |ttl| ttl.as_millis() as u64);
        [
            Arg::Text(self.id.as_str()),
            due_kind,
            due_value,
            Arg::Number(u64::from(self.priority)),
            Arg::Number(ttl_ms),
            Arg::Text(&self.stream),
            Arg::Number(self.fields.len() as u64),
        ]
        .into_iter()
        .chain(
            self.fields
                .iter()
                .flat_map(|(name, value)| [Arg::Text(name), Arg::Text(value)]),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::message::MessageId;

    #[track_caller]
    fn check_args(msg: NewMessage, expected: &str) {
        let args: Vec<String> = msg
            .script_args()
            .map(|arg| match arg {
                Arg::Text(text) => text.to_owned(),
                Arg::Number(n) => n.to_string(),
            })
            .collect();
        assert_eq!(args.join(" "), expected);
    }

    fn msg() -> NewMessage {
        NewMessage {
            id: MessageId::parse("m1").unwrap(),
            ..NewMessage::payload("orders", "hi", Duration::from_millis(1500))
        }
    }

    #[test]
    fn a_new_message_as_script_arguments() {
        check_args(msg(), "m1 in 1500 0 0 orders 1 payload hi");
        check_args(
            NewMessage {
                due: Due::At(1_700_000_000_000),
                priority: 9,
                ttl: Some(Duration::from_secs(60)),
                fields: vec![("a".into(), "1".into()), ("b".into(), "".into())],
                ..msg()
            },
            "m1 at 1700000000000 9 60000 orders 2 a 1 b ",
        );
    }
}
