//! Inbox entries as the fuzz run writes them: malformed ones (to be rejected) and
//! valid ones (to be delivered), each with what must become of it.

use rand::Rng;
use rand::rngs::StdRng;

use super::requests::value_text;
use super::{Accepted, Pairs, STREAMS, pick};

/// Inbox entries: malformed ones (rejected) and valid ones (delivered), each with
/// what must become of it.
pub(super) fn inbox_entry(rng: &mut StdRng, k: usize) -> (Pairs, Option<Accepted>) {
    let b = |s: &str| s.as_bytes().to_vec();
    let stream = pick(rng, STREAMS).to_string();
    let msg: Pairs = (0..rng.random_range(1..4))
        .map(|j| (b(&format!("m{j}")), value_text(rng).into_bytes()))
        .collect();
    let mut reserved = vec![
        (b("delayq-stream"), b(&stream)),
        (
            b("delayq-delay"),
            b(&format!("{}", rng.random_range(0..300))),
        ),
        (b("delayq-id"), b(&format!("oki-{k}"))),
    ];
    let bad: Option<(Vec<u8>, Vec<u8>)> = match rng.random_range(0..18) {
        0 => {
            reserved.remove(0);
            None
        }
        1 => {
            reserved.remove(1);
            None
        }
        2 => Some((b("delayq-prio"), b("1"))),
        3 => Some((b("delayq-at"), b("now"))),
        4 => Some((
            b("delayq-priority"),
            b(pick::<&str>(rng, &["high", "10", "-1", "1e3", ""])),
        )),
        5 => {
            reserved[2].1 = b(pick::<&str>(rng, &["a b", "", "é", "x\u{0}y"]));
            None
        }
        6 => {
            reserved[0].1 = b(pick::<&str>(rng, &["payroll", "delayq:x", "fz\u{1}", ""]));
            None
        }
        7 => {
            reserved[1].1 = b(pick::<&str>(
                rng,
                &["-5", "2h", "soon", "99999999999999999999", "1e400", "NaN"],
            ));
            None
        }
        8 => Some((b("delayq-stream"), b("fz-1"))),
        9 => Some((b("m0"), vec![0xff, 0xfe, 0x00])),
        10 => Some((vec![0xc3, 0x28], b("v"))),
        11 => Some((
            b("delayq-ttl"),
            b(pick::<&str>(rng, &["0", "-1", "forever"])),
        )),
        12 => Some((b("big"), vec![b'x'; 5000])),
        13 => {
            for j in 0..51 {
                reserved.push((b(&format!("extra{j}")), b("v")));
            }
            None
        }
        14 => {
            // More pairs than a Lua script can unpack into one command.
            for j in 0..rng.random_range(4100..6000) {
                reserved.push((b(&format!("extra{j}")), b("v")));
            }
            None
        }
        _ => return valid_inbox(rng, k, stream, reserved, msg),
    };
    let mut all = reserved;
    if let Some(extra) = bad {
        all.push(extra);
    }
    if !matches!(rng.random_range(0..3), 0) {
        all.extend(msg);
    }
    (all, None)
}

fn valid_inbox(
    rng: &mut StdRng,
    k: usize,
    stream: String,
    reserved: Pairs,
    msg: Pairs,
) -> (Pairs, Option<Accepted>) {
    let fields = msg
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k.clone()).unwrap(),
                String::from_utf8(v.clone()).unwrap(),
            )
        })
        .collect();
    let all = if rng.random_bool(0.5) {
        reserved.into_iter().chain(msg).collect()
    } else {
        msg.into_iter().chain(reserved).collect()
    };
    let accepted = Accepted {
        stream,
        fields,
        due_ms: 0,
        how: format!("inbox entry {k}"),
    };
    (all, Some(accepted))
}
