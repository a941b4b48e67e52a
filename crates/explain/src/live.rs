//! Reading the live kernel of the calling thread's network namespace: our nftables table
//! through kpr-nfnetlink's typed dumps (no `nft` process), the IPVS table and `kube-ipvs0`
//! through kpr-ipvs-netlink, the iptables rules through `iptables-save` (the variant holding
//! kube rules, as the iptables mode picks it).

use std::net::IpAddr;

use kpr_iptables::{InterfaceAddresses, Iptables, IptablesCli, LocalAddresses, Variant};
use kpr_ipvs_netlink::{Ipvs, IpvsLinks};
use kpr_model::IpFamily;
use kpr_nfnetlink::{Family, Socket, Table};
use kpr_nftables::TABLE;
use kpr_nftables::names::SetName;

use crate::nft_table::{NftTable, parse_set_name};
use crate::query::Query;
use crate::report::{Explanation, Mode, Section};
use crate::{ipt, ipvs, nft};

/// Explains `query` from the kernel objects of this network namespace, in every mode whose
/// objects exist. Read failures are reported in [`Explanation::problems`], beside what
/// could be read.
pub fn explain_live(query: &Query) -> Explanation {
    let family = query.family();
    let mut explanation = Explanation {
        query: *query,
        sections: Vec::new(),
        problems: Vec::new(),
    };
    let local = match InterfaceAddresses.addresses(family) {
        Ok(addresses) => addresses,
        Err(error) => {
            explanation.problems.push(error.to_string());
            Vec::new()
        }
    };
    match read_nftables(family) {
        Ok(Some(table)) => explanation.sections.push(Section {
            mode: Mode::Nftables,
            family,
            findings: nft::explain(&table, &local, query),
        }),
        Ok(None) => {}
        Err(problem) => explanation.problems.push(problem),
    }
    let ipvs_mode = match read_ipvs(family, query) {
        Ok(Some(section)) => {
            explanation.sections.push(section);
            true
        }
        Ok(None) => false,
        Err(problem) => {
            explanation.problems.push(problem);
            false
        }
    };
    match read_iptables(family, &local, query) {
        // ipvs mode writes KUBE-SERVICES too: iptables mode's objects are its Service chains.
        Ok(Some(section)) if ipvs_mode && section.findings.is_empty() => {}
        Ok(Some(section)) => explanation.sections.push(section),
        Ok(None) => {}
        Err(problem) => explanation.problems.push(problem),
    }
    explanation
}

/// The ipvs mode's section: `None` without `kube-ipvs0` (the mode's mark) or without IPVS.
fn read_ipvs(family: IpFamily, query: &Query) -> Result<Option<Section>, String> {
    let fail = |what: &str, e: kpr_ipvs_netlink::NetlinkError| format!("reading {what} over netlink: {e}");
    let mut links = IpvsLinks::open().map_err(|e| fail("kube-ipvs0", e))?;
    let Some(link) = links.find().map_err(|e| fail("kube-ipvs0", e))? else {
        return Ok(None);
    };
    let Some(mut ipvs) = Ipvs::open().map_err(|e| fail("the IPVS family", e))? else {
        return Ok(None);
    };
    let listed = ipvs.services().map_err(|e| fail("the IPVS virtual servers", e))?;
    let mut servers = Vec::new();
    for service in listed
        .objects
        .into_iter()
        .filter(|s| family.matches(&s.key.address))
    {
        let destinations = ipvs
            .destinations(&service.key)
            .map_err(|e| fail(&format!("the real servers of {}", service.key), e))?;
        servers.push(ipvs::VirtualServer {
            service,
            destinations: destinations.objects,
        });
    }
    Ok(Some(Section {
        mode: Mode::Ipvs,
        family,
        findings: ipvs::explain(&servers, &link.addresses, query),
    }))
}

/// Our table of `family`, or `None` when it does not exist.
fn read_nftables(family: IpFamily) -> Result<Option<NftTable>, String> {
    let nl_family = match family {
        IpFamily::V4 => Family::Ip,
        IpFamily::V6 => Family::Ip6,
    };
    let table = Table::new(nl_family, TABLE);
    let fail =
        |what: &str, e: kpr_nfnetlink::Error| format!("reading {what} of table {table} over netlink: {e}");
    let mut socket = Socket::open().map_err(|e| fail("the tables", e))?;
    let tables = socket
        .tables(Some(nl_family))
        .map_err(|e| fail("the tables", e))?;
    if !tables.iter().any(|t| t.table == table) {
        return Ok(None);
    }
    let chains = socket.chains(&table).map_err(|e| fail("the chains", e))?;
    let sets = socket.sets(&table).map_err(|e| fail("the sets", e))?;
    let mut contents = Vec::new();
    for set in sets {
        // Affinity sets hold clients, not configuration, and can be large.
        if matches!(parse_set_name(&set.name), Some(SetName::Affinity(_))) {
            continue;
        }
        let elements = socket
            .elements(&table, &set.name)
            .map_err(|e| fail(&format!("the elements of {}", set.name), e))?;
        contents.push((set.name, elements));
    }
    let rules = socket.rules(&table, None).map_err(|e| fail("the rules", e))?;
    let names = chains.into_iter().map(|c| c.chain.name);
    Ok(Some(
        NftTable::from_kernel(family, names, &contents).with_rules(&rules),
    ))
}

fn read_iptables(family: IpFamily, local: &[IpAddr], query: &Query) -> Result<Option<Section>, String> {
    let cli = IptablesCli::new(family, Variant::Auto);
    let nat = cli
        .save(kpr_iptables::Table::Nat)
        .map_err(|e| format!("reading the iptables nat table: {e}"))?;
    if !ipt::has_kube_services(&nat) {
        return Ok(None);
    }
    let filter = cli
        .save(kpr_iptables::Table::Filter)
        .map_err(|e| format!("reading the iptables filter table: {e}"))?;
    Ok(Some(Section {
        mode: Mode::Iptables,
        family,
        findings: ipt::explain(&nat, &filter, local, query),
    }))
}
