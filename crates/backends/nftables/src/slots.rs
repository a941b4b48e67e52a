//! Which endpoint sits in which slot of an entry, kept stable across syncs.
//!
//! An entry with M endpoints owns slots 0..M of its key in an endpoint map; the shared
//! `pick-...-M` chain draws `random mod M`. When endpoints come and go, endpoints that stay
//! keep their slot, a new endpoint fills a hole first, and when the count shrinks the
//! endpoints in the highest slots move into the holes. So one endpoint replaced or added is
//! one or two element changes, never a rewrite of the whole entry (D3's "replace the slot").

use std::collections::HashSet;
use std::net::{SocketAddr, SocketAddrV4};

/// Endpoints in slot order, as a bundle keeps them until its Service changes: IPv4 ones as
/// `SocketAddrV4` (6 bytes; a `SocketAddr` is 32), which at 50k Services x 10 endpoints
/// is 13 MB less.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotOrder {
    V4(Box<[SocketAddrV4]>),
    /// IPv6 (or, never in one family's table, mixed).
    Any(Box<[SocketAddr]>),
}

impl SlotOrder {
    pub fn new(order: &[SocketAddr]) -> Self {
        let v4: Option<Box<[SocketAddrV4]>> = order
            .iter()
            .map(|ep| match ep {
                SocketAddr::V4(ep) => Some(*ep),
                SocketAddr::V6(_) => None,
            })
            .collect();
        match v4 {
            Some(v4) => Self::V4(v4),
            None => Self::Any(order.into()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::V4(eps) => eps.len(),
            Self::Any(eps) => eps.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The endpoints, slot 0 first.
    pub fn iter(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        let (v4, any) = match self {
            Self::V4(eps) => (&eps[..], &[][..]),
            Self::Any(eps) => (&[][..], &eps[..]),
        };
        v4.iter().map(|ep| SocketAddr::V4(*ep)).chain(any.iter().copied())
    }

    pub fn to_vec(&self) -> Vec<SocketAddr> {
        self.iter().collect()
    }
}

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
    fn slot_orders_keep_the_order_compact_or_not() {
        let v4 = eps(&[3, 1, 2]);
        let order = SlotOrder::new(&v4);
        assert!(matches!(order, SlotOrder::V4(_)));
        assert_eq!(order.to_vec(), v4);
        let v6: Vec<SocketAddr> = vec!["[fd00::2]:80".parse().unwrap(), "[fd00::1]:81".parse().unwrap()];
        let order = SlotOrder::new(&v6);
        assert!(matches!(order, SlotOrder::Any(_)));
        assert_eq!((order.to_vec(), order.len()), (v6, 2));
        assert!(SlotOrder::new(&[]).is_empty());
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
