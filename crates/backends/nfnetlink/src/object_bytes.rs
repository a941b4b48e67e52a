//! Our named-counter messages against nft's own (nftables 1.0.6), byte for byte: captured
//! in a throw-away namespace with `strace -f -e trace=sendmsg,sendto -e write=3 nft ...`
//! (requests) and `-e trace=recvmsg -e read=3` (the kernel's dump answer, Linux 6.18).
//! Sequence numbers are zeroed on both sides; everything else must match.

use crate::attr::Writer;
use crate::batch::Batch;
use crate::captured::{hex, without_sequence};
use crate::dump;
use crate::expr::{Expr, RejectKind, encode_list};
use crate::objects::{Counter, Family, ObjectType, Table};
use crate::socket::objects_request;

/// The one message of `batch` against nft's.
fn same(batch: &Batch, nft: &str) {
    assert_eq!(batch.len(), 1);
    assert_eq!(without_sequence(batch.buf.clone()), without_sequence(hex(nft)));
}

fn table(family: Family) -> Table {
    Table::new(family, "kube-proxy")
}

const UDP: &str = "localhost-nodeport-rejected-udp";

/// `nft add counter ip kube-proxy localhost-nodeport-rejected-udp` (and `ip6 ... -sctp`).
#[test]
fn a_new_counter_is_nfts_newobj() {
    let mut batch = Batch::new();
    batch.add_counter(&table(Family::Ip), UDP);
    same(
        &batch,
        "6c000000120a01040000000000000000020000000f0001006b7562652d70726f78790000240002006c6f63616c686f73742d6e6f6465706f72742d72656a65637465642d7564700008000300000000011c0004800c00010000000000000000000c0002000000000000000000",
    );
    let mut batch = Batch::new();
    batch.add_counter(&table(Family::Ip6), "localhost-nodeport-rejected-sctp");
    same(
        &batch,
        "70000000120a010400000000000000000a0000000f0001006b7562652d70726f78790000250002006c6f63616c686f73742d6e6f6465706f72742d72656a65637465642d736374700000000008000300000000011c0004800c00010000000000000000000c0002000000000000000000",
    );
}

/// `nft delete counter ip kube-proxy <name>` and `... handle 2`.
#[test]
fn deleting_a_counter_by_name_or_handle_is_nfts_delobj() {
    let mut batch = Batch::new();
    batch.delete_object(&table(Family::Ip), ObjectType::COUNTER, UDP);
    same(
        &batch,
        "54000000140a01000000000000000000020000000f0001006b7562652d70726f78790000240002006c6f63616c686f73742d6e6f6465706f72742d72656a65637465642d75647000080003000000000104000480",
    );
    let mut batch = Batch::new();
    batch.delete_object_by_handle(&table(Family::Ip), ObjectType::COUNTER, 2);
    same(
        &batch,
        "3c000000140a01000000000000000000020000000f0001006b7562652d70726f787900000c0006000000000000000002080003000000000104000480",
    );
}

/// `nft add rule ip kube-proxy nodeport-endpoints-check counter name "<name>" reject`: the
/// reference is an `objref` expression naming the counter.
#[test]
fn a_rule_counting_into_a_named_counter_is_nfts_objref() {
    let mut batch = Batch::new();
    batch.add_rule(
        &table(Family::Ip),
        "nodeport-endpoints-check",
        &[
            Expr::ObjRef {
                kind: ObjectType::COUNTER,
                name: UDP.into(),
            },
            Expr::Reject {
                kind: RejectKind::IcmpUnreach,
                code: 3,
            },
        ],
    );
    same(
        &batch,
        "ac000000060a010c0000000000000000020000000f0001006b7562652d70726f787900001d0002006e6f6465706f72742d656e64706f696e74732d636865636b0000000068000480400001800b0001006f626a7265660000300002800800010000000001230002006c6f63616c686f73742d6e6f6465706f72742d72656a65637465642d75647000240001800b00010072656a65637400001400028008000100000000000500020003000000",
    );
}

/// `nft list counters table ip kube-proxy` asks for the table's objects of every type; the
/// kernel's answer for a counter at 7 packets, 420 bytes reads back as such.
#[test]
fn listing_counters_is_nfts_getobj_dump_and_its_answer_decodes() {
    let request = objects_request(&table(Family::Ip), None).unwrap();
    assert_eq!(
        without_sequence(request),
        hex("24000000130a01030000000000000000020000000f0001006b7562652d70726f78790000")
    );
    let answer = hex(
        "80000000120a020800000000016f0000020000020f0001006b7562652d70726f78790000240002006c6f63616c686f73742d6e6f6465706f72742d72656a65637465642d7564700008000300000000010c000600000000000000000108000500000000001c0004000c00010000000000000001a40c0002000000000000000007",
    );
    let object = dump::object(&answer[16..]).unwrap();
    assert_eq!(object.table, table(Family::Ip));
    assert_eq!(object.name, UDP);
    assert_eq!(object.kind, ObjectType::COUNTER);
    assert_eq!(object.handle, 1);
    assert_eq!(object.use_count, 0);
    assert_eq!(
        object.counter,
        Some(Counter {
            packets: 7,
            bytes: 420
        })
    );
}

/// A decoded objref encodes to the same bytes again (the kernel lists it as it was sent).
#[test]
fn an_objref_round_trips() {
    let exprs = vec![Expr::ObjRef {
        kind: ObjectType::COUNTER,
        name: UDP.into(),
    }];
    let mut buf = Vec::new();
    encode_list(&mut Writer::new(&mut buf), &exprs);
    let decoded = crate::expr::decode_list(crate::attr::Attrs::new(&buf)).unwrap();
    assert_eq!(decoded, exprs);
    assert_eq!(
        decoded[0].to_string(),
        "counter name \"localhost-nodeport-rejected-udp\""
    );
    assert_eq!(ObjectType(6).to_string(), "object type 6");
}
