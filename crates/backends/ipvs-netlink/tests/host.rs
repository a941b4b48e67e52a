//! On this host's kernel, which has no IPVS: the client says so cleanly instead of failing.

use kpr_ipvs_netlink::Ipvs;

#[test]
fn a_kernel_without_ipvs_opens_as_none_and_one_with_it_as_some() {
    let present = Ipvs::open()
        .expect("the generic-netlink controller answers")
        .is_some();
    let has_ipvs = std::path::Path::new("/proc/net/ip_vs").exists()
        || std::fs::read_to_string("/proc/modules")
            .unwrap_or_default()
            .lines()
            .any(|line| line.starts_with("ip_vs "));
    assert_eq!(present, has_ipvs, "the family lookup disagrees with /proc");
}
