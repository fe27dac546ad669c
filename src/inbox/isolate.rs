//! Poison input isolated: a failed call is split until the item at fault is found.

use super::*;

/// How one item of a batch ended after [`isolate`].
#[derive(Debug)]
pub(super) enum Isolated<T> {
    Done(T),
    /// Redis did not take the call now; the item is not at fault.
    Transient(StoreError),
    /// The item failed alone, for reasons of its own.
    Fault(StoreError),
}

/// Calls `call` on items `0..n` and isolates the ones at fault: the items of a
/// failed call (any error but a transient one) are tried again in halves until
/// each failure is pinned on one item. `call` answers for each index it is given,
/// in order, and a failed call fails every item it carried. Outcomes come back in
/// index order. Items that succeeded are never sent again, so `n` items with one at
/// fault cost about 2 log2(n) calls.
pub(super) async fn isolate<T, F, Fut>(n: usize, call: F) -> Vec<Isolated<T>>
where
    F: Fn(Vec<usize>) -> Fut,
    Fut: Future<Output = Vec<Result<T, StoreError>>>,
{
    let mut out: Vec<Option<Isolated<T>>> = (0..n).map(|_| None).collect();
    let mut groups = vec![(0..n).collect::<Vec<usize>>()];
    while let Some(group) = groups.pop() {
        if group.is_empty() {
            continue;
        }
        let alone = group.len() == 1;
        let mut answers = call(group.clone()).await.into_iter();
        let mut failed = Vec::new();
        for i in group {
            let answer = answers
                .next()
                .unwrap_or_else(|| Err(StoreError::Reply("no answer for a batch item".into())));
            match answer {
                Ok(done) => out[i] = Some(Isolated::Done(done)),
                Err(e) if e.is_transient() => out[i] = Some(Isolated::Transient(e)),
                Err(e) if alone => out[i] = Some(Isolated::Fault(e)),
                Err(e) => failed.push((i, e)),
            }
        }
        match failed.len() {
            0 => {}
            // The only item of its call that failed: the call carried it alone.
            1 => {
                let (i, e) = failed.remove(0);
                out[i] = Some(Isolated::Fault(e));
            }
            len => {
                let mut first: Vec<usize> = failed.into_iter().map(|(i, _)| i).collect();
                let second = first.split_off(len / 2);
                groups.push(second);
                groups.push(first);
            }
        }
    }
    out.into_iter()
        .map(|o| o.expect("every item answered"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`isolate`] on `n` items against a call that fails as a whole when it
    /// carries one of `poison`, and answers a transient error for each of
    /// `transient` otherwise; checks which items end at fault and which transient,
    /// that the others are done, and that it took at most `max_calls` calls.
    #[track_caller]
    fn check_isolate(
        n: usize,
        poison: &[usize],
        transient: &[usize],
        (faults, transients): (&[usize], &[usize]),
        max_calls: usize,
    ) {
        let calls = std::cell::Cell::new(0);
        let outcomes = futures::executor::block_on(isolate(n, |group: Vec<usize>| {
            calls.set(calls.get() + 1);
            let answers: Vec<Result<usize, StoreError>> =
                if group.iter().any(|i| poison.contains(i)) {
                    let e = StoreError::Redis(redis::make_extension_error(
                        "ERR".into(),
                        Some("poison".into()),
                    ));
                    group.iter().map(|_| Err(e.clone())).collect()
                } else {
                    group
                        .iter()
                        .map(|&i| match transient.contains(&i) {
                            true => Err(StoreError::Busy("not now".into())),
                            false => Ok(i),
                        })
                        .collect()
                };
            std::future::ready(answers)
        }));
        let (mut got_faults, mut got_transients) = (Vec::new(), Vec::new());
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Isolated::Done(done) => assert_eq!(done, i, "item {i} answered for another"),
                Isolated::Transient(_) => got_transients.push(i),
                Isolated::Fault(_) => got_faults.push(i),
            }
        }
        assert_eq!(
            (&got_faults[..], &got_transients[..]),
            (faults, transients),
            "{n} items, poison {poison:?}"
        );
        assert!(
            calls.get() <= max_calls,
            "{} calls for {n} items, poison {poison:?}",
            calls.get()
        );
    }

    #[test]
    #[rustfmt::skip]
    fn failed_calls_are_split_until_the_item_at_fault_is_found() {
        check_isolate(0, &[], &[], (&[], &[]), 0);
        check_isolate(8, &[], &[], (&[], &[]), 1);
        check_isolate(1, &[0], &[], (&[0], &[]), 1);
        check_isolate(8, &[5], &[], (&[5], &[]), 7);
        check_isolate(8, &[0, 7], &[], (&[0, 7], &[]), 11);
        check_isolate(4, &[0, 1, 2, 3], &[], (&[0, 1, 2, 3], &[]), 7);
        check_isolate(500, &[123], &[], (&[123], &[]), 19);
        check_isolate(3, &[], &[1], (&[], &[1]), 1);
        check_isolate(6, &[2], &[4], (&[2], &[4]), 9);
    }
}
