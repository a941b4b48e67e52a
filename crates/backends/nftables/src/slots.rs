//! Which endpoint sits in which slot of an entry, kept stable across syncs.
//!
//! An entry with M endpoints owns slots 0..M of its key in an endpoint map; the shared
//! `pick-...-M` chain draws `random mod M`. When endpoints come and go, endpoints that stay
//! keep their slot, a new endpoint fills a hole first, and when the count shrinks the
//! endpoints in the highest slots move into the holes. So one endpoint replaced or added is
//! one or two element changes, never a rewrite of the whole entry (D3's "replace the slot").

use std::collections::HashSet;
use std::net::SocketAddr;

/// The new slot order for `current` endpoints, given the order of the previous sync
/// (`None`: no history, endpoints in their given order).
pub fn assign(previous: Option<&[SocketAddr]>, current: &[SocketAddr]) -> Vec<SocketAddr> {
    let Some(previous) = previous else {
        return current.to_vec();
    };
    let wanted: HashSet<&SocketAddr> = current.iter().collect();
    let mut slots: Vec<Option<SocketAddr>> = previous
        .iter()
        .map(|ep| wanted.contains(ep).then_some(*ep))
        .collect();
    let kept: HashSet<SocketAddr> = slots.iter().flatten().copied().collect();
    let mut newcomers = current.iter().filter(|ep| !kept.contains(ep)).copied();
    // New endpoints fill holes first, then go to the end.
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match newcomers.next() {
            Some(ep) => *slot = Some(ep),
            None => break,
        }
    }
    slots.extend(newcomers.map(Some));
    // Holes left: move the endpoints of the highest slots into them.
    let mut out: Vec<Option<SocketAddr>> = slots;
    let mut hole = 0;
    while hole < out.len() {
        if out[hole].is_some() {
            hole += 1;
            continue;
        }
        // The hole is below the last slot here, so it still exists after the pop.
        if let Some(Some(last)) = out.pop() {
            out[hole] = Some(last);
        }
    }
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(hosts: &[u8]) -> Vec<SocketAddr> {
        hosts
            .iter()
            .map(|h| SocketAddr::from(([10, 0, 0, *h], 80)))
            .collect()
    }

    #[test]
    fn without_history_the_given_order_is_kept() {
        assert_eq!(assign(None, &eps(&[3, 1, 2])), eps(&[3, 1, 2]));
    }

    #[test]
    fn an_added_endpoint_takes_the_next_slot() {
        assert_eq!(
            assign(Some(&eps(&[1, 2, 3])), &eps(&[4, 1, 2, 3])),
            eps(&[1, 2, 3, 4])
        );
    }

    #[test]
    fn a_removed_endpoint_is_replaced_by_the_last_one() {
        assert_eq!(
            assign(Some(&eps(&[1, 2, 3, 4])), &eps(&[1, 3, 4])),
            eps(&[1, 4, 3])
        );
    }

    #[test]
    fn a_replaced_endpoint_keeps_the_slot() {
        assert_eq!(assign(Some(&eps(&[1, 2, 3])), &eps(&[1, 3, 9])), eps(&[1, 9, 3]));
    }

    #[test]
    fn several_holes_are_filled_from_the_end() {
        assert_eq!(
            assign(Some(&eps(&[1, 2, 3, 4, 5])), &eps(&[2, 5, 4])),
            eps(&[5, 2, 4])
        );
        assert_eq!(assign(Some(&eps(&[1, 2])), &[]), eps(&[]));
        assert_eq!(assign(Some(&eps(&[1, 2, 3])), &eps(&[3])), eps(&[3]));
    }
}
