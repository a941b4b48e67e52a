//! A handle on the calling thread's network namespace's IPVS: one generic-netlink socket
//! and the family id, resolved once.
//!
//! A kernel without `ip_vs` has no `IPVS` family: [`Ipvs::open`] says so with `Ok(None)`, so
//! callers tell "nothing to do here" from a failure.

use kpr_netlink::{Answer, Channel, ENOENT, NETLINK_GENERIC, NetlinkError};

use crate::messages::{self, family_id_in, family_request};
use crate::types::{Destination, Service, ServiceKey, Timeouts};

pub struct Ipvs {
    channel: Channel,
    family: u16,
}

impl std::fmt::Debug for Ipvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ipvs").field("family", &self.family).finish()
    }
}

/// Listed objects, and what could not be read (each with the reason), which callers
/// leave alone.
#[derive(Debug, Default)]
pub struct Listing<T> {
    pub objects: Vec<T>,
    pub unreadable: Vec<String>,
}

impl Ipvs {
    /// IPVS in the calling thread's namespace, or `None` when the kernel has none.
    pub fn open() -> Result<Option<Self>, NetlinkError> {
        let mut channel = Channel::open(NETLINK_GENERIC)?;
        let answers = match channel.request(family_request) {
            Ok(answers) => answers,
            Err(NetlinkError::Kernel { errno: ENOENT }) => return Ok(None),
            Err(error) => return Err(error),
        };
        let family = answers
            .iter()
            .find_map(|a| family_id_in(a.message_type, a.payload()))
            .ok_or_else(|| NetlinkError::Malformed("no family id for IPVS".to_string()))?;
        Ok(Some(Self { channel, family }))
    }

    /// Every address-based TCP/UDP/SCTP virtual service (others are not listed).
    pub fn services(&mut self) -> Result<Listing<Service>, NetlinkError> {
        let family = self.family;
        let answers = self
            .channel
            .request(|seq| messages::list_services_request(family, seq))?;
        Ok(listing(&answers, messages::parse_service))
    }

    pub fn add_service(&mut self, service: &Service) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::new_service_request(family, service, seq))
    }

    pub fn update_service(&mut self, service: &Service) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::set_service_request(family, service, seq))
    }

    pub fn delete_service(&mut self, key: &ServiceKey) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::delete_service_request(family, key, seq))
    }

    /// The real servers of `key`'s service.
    pub fn destinations(&mut self, key: &ServiceKey) -> Result<Listing<Destination>, NetlinkError> {
        let family = self.family;
        let answers = self
            .channel
            .request(|seq| messages::list_destinations_request(family, key, seq))?;
        Ok(listing(&answers, |payload| {
            messages::parse_destination(payload, key.address).map(Some)
        }))
    }

    pub fn add_destination(
        &mut self,
        key: &ServiceKey,
        destination: &Destination,
    ) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::new_destination_request(family, key, destination, seq))
    }

    pub fn update_destination(
        &mut self,
        key: &ServiceKey,
        destination: &Destination,
    ) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::set_destination_request(family, key, destination, seq))
    }

    pub fn delete_destination(
        &mut self,
        key: &ServiceKey,
        destination: &Destination,
    ) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::delete_destination_request(family, key, destination, seq))
    }

    pub fn set_timeouts(&mut self, timeouts: &Timeouts) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::set_timeouts_request(family, timeouts, seq))
    }

    pub fn timeouts(&mut self) -> Result<Timeouts, NetlinkError> {
        let family = self.family;
        let answers = self
            .channel
            .request(|seq| messages::get_timeouts_request(family, seq))?;
        let answer = answers
            .first()
            .ok_or_else(|| NetlinkError::Malformed("no answer to IPVS_CMD_GET_CONFIG".to_string()))?;
        messages::parse_timeouts(answer.payload()).map_err(NetlinkError::Malformed)
    }

    /// Deletes every virtual service in this namespace (`ipvsadm -C`).
    pub fn flush(&mut self) -> Result<(), NetlinkError> {
        let family = self.family;
        self.acked(|seq| messages::flush_request(family, seq))
    }

    fn acked(&mut self, build: impl FnOnce(u32) -> Vec<u8>) -> Result<(), NetlinkError> {
        self.channel.request(build).map(drop)
    }
}

fn listing<T>(answers: &[Answer], parse: impl Fn(&[u8]) -> Result<Option<T>, String>) -> Listing<T> {
    let mut listing = Listing {
        objects: Vec::with_capacity(answers.len()),
        unreadable: Vec::new(),
    };
    for answer in answers {
        match parse(answer.payload()) {
            Ok(Some(object)) => listing.objects.push(object),
            Ok(None) => {}
            Err(reason) => listing.unreadable.push(reason),
        }
    }
    listing
}
