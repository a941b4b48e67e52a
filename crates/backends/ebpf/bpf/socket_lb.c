// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
//
// kube-proxy-rs ebpf mode: Service connections translated at the socket, on a cgroup v2.
//
//   connect4/6      TCP and connected UDP: pick an endpoint, rewrite the destination
//   sendmsg4/6      unconnected UDP, per datagram: the same
//   recvmsg4/6      UDP replies: the source back to the Service address
//   getpeername4/6  the application sees the Service address
//
// One address space for both families: an IPv4 address is kept IPv4-mapped
// (::ffff:a.b.c.d), so IPv4 programs and IPv4-mapped IPv6 sockets meet the same entries.
// Addresses and ports are in network byte order, as the context carries them.
//
// A Service address without an entry (no usable endpoint) is left untranslated: the
// nftables rules of the same process then REJECT or DROP it as upstream does. A backend
// slot that cannot be read (an update in flight) also leaves it to nftables, which never
// refuses a Service that has endpoints.
//
// The layouts below are read and written byte for byte by src/maps.rs.

#include <linux/types.h>
#include <linux/bpf.h>

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define INLINE static inline __attribute__((always_inline))

#define PIN_BY_NAME 1
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define PROTO_TCP 6
#define PROTO_UDP 17
#define NS_PER_SECOND 1000000000ULL
#define AF_INET_NUMBER 2

// ::ffff:0:0/96's third 32-bit word (0x0000ffff in network order), as the host loads it.
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MAPPED_PREFIX 0xffff0000
#else
#define MAPPED_PREFIX 0x0000ffff
#endif

// The kernel helpers used, by their stable numbers (include/uapi/linux/bpf.h).
static void *(*map_lookup)(void *map, const void *key) = (void *)BPF_FUNC_map_lookup_elem;
static long (*map_update)(void *map, const void *key, const void *value, __u64 flags) =
	(void *)BPF_FUNC_map_update_elem;
static __u64 (*ktime_get_ns)(void) = (void *)BPF_FUNC_ktime_get_ns;
static __u32 (*prandom_u32)(void) = (void *)BPF_FUNC_get_prandom_u32;
static __u64 (*socket_cookie)(void *ctx) = (void *)BPF_FUNC_get_socket_cookie;
static __u64 (*netns_cookie)(void *ctx) = (void *)BPF_FUNC_get_netns_cookie;

struct addr_port {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct service_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

struct service_value {
	__u32 count; // endpoint slots 0..count-1 in `backends`; never 0 (no entry instead)
	__u32 id;    // the endpoint set's id
	__u32 affinity_seconds; // ClientIP affinity timeout, 0 = none
	__u32 flags; // SERVICE_* below; for `explain`
};

struct backend_key {
	__u32 id;
	__u32 slot;
};

// ClientIP affinity: the client is its network namespace (a pod, or the node) and the
// source address its socket is bound to, if any (IPv4-mapped; zero when unbound: the
// namespace's own address will be chosen).
struct affinity_key {
	__u64 client;
	__u32 id;
	__u32 pad;
	__u32 source[4];
};

struct affinity_value {
	struct addr_port backend;
	__u32 slot;
	__u64 last_used_ns;
};

// Reverse translation: which Service address a socket's peer (the endpoint it was given)
// stands for: the source of UDP replies, and what getpeername() shows.
struct revnat_key {
	__u64 cookie;
	struct addr_port backend;
	__u32 pad;
};

_Static_assert(sizeof(struct addr_port) == 20, "addr_port");
_Static_assert(sizeof(struct service_key) == 20, "service_key");
_Static_assert(sizeof(struct service_value) == 16, "service_value");
_Static_assert(sizeof(struct backend_key) == 8, "backend_key");
_Static_assert(sizeof(struct affinity_key) == 32, "affinity_key");
_Static_assert(sizeof(struct affinity_value) == 32, "affinity_value");
_Static_assert(sizeof(struct revnat_key) == 32, "revnat_key");

// Capacities are the loader's (src/maps.rs sets them); these are placeholders.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct service_key);
	__type(value, struct service_value);
	__uint(pinning, PIN_BY_NAME);
} kpr_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct backend_key);
	__type(value, struct addr_port);
	__uint(pinning, PIN_BY_NAME);
} kpr_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(pinning, PIN_BY_NAME);
} kpr_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1);
	__type(key, struct revnat_key);
	__type(value, struct addr_port);
	__uint(pinning, PIN_BY_NAME);
} kpr_revnat SEC(".maps");

// TCP or UDP, by socket type and protocol (ping sockets are SOCK_DGRAM too); 0 otherwise.
INLINE __u8 l4_protocol(struct bpf_sock_addr *ctx)
{
	__u32 type = ctx->type;
	__u32 protocol = ctx->protocol;

	if (type == SOCK_STREAM && protocol == PROTO_TCP)
		return PROTO_TCP;
	if (type == SOCK_DGRAM && protocol == PROTO_UDP)
		return PROTO_UDP;
	return 0;
}

INLINE int same_backend(const struct addr_port *a, const struct addr_port *b)
{
	return a->addr[0] == b->addr[0] && a->addr[1] == b->addr[1] && a->addr[2] == b->addr[2] &&
	       a->addr[3] == b->addr[3] && a->port == b->port;
}

// The endpoint for a new connection to `svc`: the client's affine one while it is still an
// endpoint and its timeout has not passed, else a random slot.
INLINE struct addr_port *pick(struct bpf_sock_addr *ctx, struct service_value *svc)
{
	__u32 count = svc->count;
	if (count == 0)
		return 0;
	struct backend_key bkey = { .id = svc->id };
	struct addr_port *backend;

	if (svc->affinity_seconds == 0) {
		bkey.slot = prandom_u32() % count;
		return map_lookup(&kpr_backends, &bkey);
	}

	struct affinity_key akey = { .client = netns_cookie(ctx), .id = svc->id };
	struct bpf_sock *sk = ctx->sk;
	if (sk) {
		if (ctx->user_family == AF_INET_NUMBER) {
			__u32 source = sk->src_ip4;
			if (source) {
				akey.source[2] = MAPPED_PREFIX;
				akey.source[3] = source;
			}
		} else {
			akey.source[0] = sk->src_ip6[0];
			akey.source[1] = sk->src_ip6[1];
			akey.source[2] = sk->src_ip6[2];
			akey.source[3] = sk->src_ip6[3];
		}
	}
	__u64 now = ktime_get_ns();
	struct affinity_value *held = map_lookup(&kpr_affinity, &akey);
	if (held && now - held->last_used_ns <= (__u64)svc->affinity_seconds * NS_PER_SECOND &&
	    held->slot < count) {
		bkey.slot = held->slot;
		backend = map_lookup(&kpr_backends, &bkey);
		if (backend && same_backend(backend, &held->backend)) {
			held->last_used_ns = now;
			return backend;
		}
	}
	bkey.slot = prandom_u32() % count;
	backend = map_lookup(&kpr_backends, &bkey);
	if (!backend)
		return 0;
	struct affinity_value fresh = { .backend = *backend, .slot = bkey.slot, .last_used_ns = now };
	map_update(&kpr_affinity, &akey, &fresh, BPF_ANY);
	return backend;
}

// Translates a connect or a datagram to `key` (addr filled in by the caller). On success
// the endpoint is in *out. Returns 1 when translated.
INLINE int translate(struct bpf_sock_addr *ctx, struct service_key *key, struct addr_port *out)
{
	key->proto = l4_protocol(ctx);
	if (!key->proto)
		return 0;
	key->port = (__u16)ctx->user_port;
	struct service_value *svc = map_lookup(&kpr_services, key);
	if (!svc)
		return 0;
	struct addr_port *backend = pick(ctx, svc);
	if (!backend)
		return 0;
	*out = *backend;
	// For UDP replies (recvmsg) and for getpeername() of TCP and UDP sockets alike.
	struct revnat_key rkey = { .cookie = socket_cookie(ctx), .backend = *backend };
	struct addr_port service = { .port = key->port };
	service.addr[0] = key->addr[0];
	service.addr[1] = key->addr[1];
	service.addr[2] = key->addr[2];
	service.addr[3] = key->addr[3];
	map_update(&kpr_revnat, &rkey, &service, BPF_ANY);
	return 1;
}

// The Service address a UDP reply from `from` on this socket answers for, if any.
INLINE struct addr_port *service_of(struct bpf_sock_addr *ctx, struct addr_port *from)
{
	struct revnat_key rkey = { .cookie = socket_cookie(ctx), .backend = *from };
	return map_lookup(&kpr_revnat, &rkey);
}


INLINE void set_v4_key(struct service_key *key, __u32 addr)
{
	key->addr[0] = 0;
	key->addr[1] = 0;
	key->addr[2] = MAPPED_PREFIX;
	key->addr[3] = addr;
}

INLINE int v4_connect(struct bpf_sock_addr *ctx)
{
	struct service_key key = {};
	struct addr_port backend;

	set_v4_key(&key, ctx->user_ip4);
	if (!translate(ctx, &key, &backend))
		return 1;
	// An IPv4 socket can only reach an IPv4 endpoint: the maps keep families apart.
	ctx->user_ip4 = backend.addr[3];
	ctx->user_port = backend.port;
	return 1;
}

INLINE void v4_restore(struct bpf_sock_addr *ctx)
{
	struct addr_port from = { .port = (__u16)ctx->user_port };

	from.addr[2] = MAPPED_PREFIX;
	from.addr[3] = ctx->user_ip4;
	struct addr_port *service = service_of(ctx, &from);
	if (!service)
		return;
	ctx->user_ip4 = service->addr[3];
	ctx->user_port = service->port;
}

INLINE int v6_connect(struct bpf_sock_addr *ctx)
{
	struct service_key key = {};
	struct addr_port backend;

	key.addr[0] = ctx->user_ip6[0];
	key.addr[1] = ctx->user_ip6[1];
	key.addr[2] = ctx->user_ip6[2];
	key.addr[3] = ctx->user_ip6[3];
	if (!translate(ctx, &key, &backend))
		return 1;
	ctx->user_ip6[0] = backend.addr[0];
	ctx->user_ip6[1] = backend.addr[1];
	ctx->user_ip6[2] = backend.addr[2];
	ctx->user_ip6[3] = backend.addr[3];
	ctx->user_port = backend.port;
	return 1;
}

INLINE void v6_restore(struct bpf_sock_addr *ctx)
{
	struct addr_port from = { .port = (__u16)ctx->user_port };

	from.addr[0] = ctx->user_ip6[0];
	from.addr[1] = ctx->user_ip6[1];
	from.addr[2] = ctx->user_ip6[2];
	from.addr[3] = ctx->user_ip6[3];
	struct addr_port *service = service_of(ctx, &from);
	if (!service)
		return;
	ctx->user_ip6[0] = service->addr[0];
	ctx->user_ip6[1] = service->addr[1];
	ctx->user_ip6[2] = service->addr[2];
	ctx->user_ip6[3] = service->addr[3];
	ctx->user_port = service->port;
}

// connect and sendmsg programs return 1 (go on) or 0 (EPERM); we never refuse here.
// recvmsg and getpeername programs must return 1.

// build.rs builds this file a second time with KPR_REFUSED_BY_THE_VERIFIER, for the
// loader's test of a program the kernel refuses: the last program loaded then returns 0.
#ifdef KPR_REFUSED_BY_THE_VERIFIER
#define GETPEERNAME6_RETURN 0
#else
#define GETPEERNAME6_RETURN 1
#endif

SEC("cgroup/connect4")
int kpr_connect4(struct bpf_sock_addr *ctx)
{
	return v4_connect(ctx);
}

SEC("cgroup/sendmsg4")
int kpr_sendmsg4(struct bpf_sock_addr *ctx)
{
	return v4_connect(ctx);
}

SEC("cgroup/recvmsg4")
int kpr_recvmsg4(struct bpf_sock_addr *ctx)
{
	v4_restore(ctx);
	return 1;
}

SEC("cgroup/getpeername4")
int kpr_getpeername4(struct bpf_sock_addr *ctx)
{
	v4_restore(ctx);
	return 1;
}

SEC("cgroup/connect6")
int kpr_connect6(struct bpf_sock_addr *ctx)
{
	return v6_connect(ctx);
}

SEC("cgroup/sendmsg6")
int kpr_sendmsg6(struct bpf_sock_addr *ctx)
{
	return v6_connect(ctx);
}

SEC("cgroup/recvmsg6")
int kpr_recvmsg6(struct bpf_sock_addr *ctx)
{
	v6_restore(ctx);
	return 1;
}

SEC("cgroup/getpeername6")
int kpr_getpeername6(struct bpf_sock_addr *ctx)
{
	v6_restore(ctx);
	return GETPEERNAME6_RETURN;
}

char LICENSE[] SEC("license") = "GPL";
