// SPDX-License-Identifier: GPL-2.0 OR MIT
/* The reflector's in-kernel fan-out (paper 000 §4.2-4.4 on a stock kernel).
 *
 * Attached with a TCX link on the ingress of each device that carries the
 * reflector's address. A DATA datagram to a group port from a member is
 * checked (header fields, SipHash-2-4 tag, replay window) and replicated to
 * every other member: the source becomes the group's address and port, then
 * for each destination the IPv4 destination, UDP port and Ethernet addresses
 * are rewritten, the IPv4 and UDP checksums fixed incrementally, and the
 * packet cloned to the destination's egress device. The original is then
 * dropped. Anything else (not IPv4/UDP, IP options, fragments, GSO, not a
 * group port, malformed, not DATA, not from a member, a group in user-space
 * mode) passes up untouched: user space judges it as it does today.
 */
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "fanout.h"

/* TCX verdicts (Linux 6.6 uapi; older headers lack the names). NEXT lets
 * the next program and then the stack have the packet. */
#ifndef TCX_NEXT
#define TCX_NEXT -1
#define TCX_PASS 0
#define TCX_DROP 2
#endif

_Static_assert(sizeof(struct fanout_dest) == 28, "fanout_dest layout");
_Static_assert((FANOUT_MAX_MEMBERS & (FANOUT_MAX_MEMBERS - 1)) == 0, "the member bound is a mask");
_Static_assert(sizeof(struct fanout_group) == 24 + 28 * FANOUT_MAX_MEMBERS, "fanout_group layout");
_Static_assert(sizeof(struct fanout_member_key) == 8, "fanout_member_key layout");
_Static_assert(sizeof(struct fanout_member) == 80, "fanout_member layout");
_Static_assert(sizeof(struct fanout_counters) == 96, "fanout_counters layout");
_Static_assert(PROTO_LEAVE_LEN == PROTO_HEADER_LEN + 16, "a LEAVE is the header and a MAC");
_Static_assert(PROTO_OFF_SEQ + 8 <= PROTO_HEADER_LEN && PROTO_OFF_MEMBERSHIP + 4 <= PROTO_HEADER_LEN,
	       "every field read lies in the header the bounds check covers");
_Static_assert(FANOUT_RESEND_MAX == PROTO_MAX_DATAGRAM_KERNEL, "the kernel path's largest DATA is the protocol's");
_Static_assert(sizeof(struct fanout_resend) == 16 + FANOUT_RESEND_BUF, "fanout_resend layout");
_Static_assert(FANOUT_RESEND_MAX <= FANOUT_RESEND_BUF && (FANOUT_RESEND_BUF & (FANOUT_RESEND_BUF - 1)) == 0,
	       "the resend room is a mask");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u16);
	__type(value, struct fanout_group);
	/* Not preallocated: an update replaces the element and frees the old
	 * one after an RCU grace period, so a running fan-out keeps a whole,
	 * consistent destination list. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
} groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FANOUT_MAX_SENDERS);
	__type(key, struct fanout_member_key);
	__type(value, struct fanout_member);
} members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, struct fanout_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FANOUT_RESEND_RING);
} resend SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, __u64);
} queued SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, __u64);
} resent SEC(".maps");

/* held: set by user space while it serves a group's DATA itself (passed up
 * during congestion, or for any other reason) until its socket is drained,
 * so the kernel does not overtake datagrams still queued there by more than
 * the replay window can reorder. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, __u64);
} held SEC(".maps");

/* leave_seen, leave_done: the LEAVE fence (see fanout.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, __u64);
} leave_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FANOUT_MAX_GROUPS);
	__type(key, __u32);
	__type(value, __u64);
} leave_done SEC(".maps");

#define ETH_LEN 14
#define IP_OFF ETH_LEN
#define UDP_OFF (ETH_LEN + 20)
#define DGRAM_OFF (UDP_OFF + 8)
#define IP_CSUM_OFF (IP_OFF + offsetof(struct iphdr, check))
#define IP_SRC_OFF (IP_OFF + offsetof(struct iphdr, saddr))
#define IP_DST_OFF (IP_OFF + offsetof(struct iphdr, daddr))
#define UDP_CSUM_OFF (UDP_OFF + offsetof(struct udphdr, check))
#define UDP_SPORT_OFF (UDP_OFF + offsetof(struct udphdr, source))
#define UDP_DPORT_OFF (UDP_OFF + offsetof(struct udphdr, dest))
/* The largest datagram hashed in the kernel: a 9000-byte jumbo frame. */
#define MAX_HASH_WORDS (9000 / 8)

/* ---- SipHash-2-4 (Aumasson and Bernstein), over the packet in 8-byte words ---- */

#define ROTL(x, b) (__u64)(((x) << (b)) | ((x) >> (64 - (b))))

struct sip {
	__u64 v0, v1, v2, v3;
};

static __always_inline void sipround(struct sip *s)
{
	s->v0 += s->v1;
	s->v1 = ROTL(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = ROTL(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = ROTL(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = ROTL(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = ROTL(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = ROTL(s->v2, 32);
}

static __always_inline void sip_block(struct sip *s, __u64 m)
{
	s->v3 ^= m;
	sipround(s);
	sipround(s);
	s->v0 ^= m;
}

struct hash_ctx {
	struct __sk_buff *skb;
	struct sip s;
	int failed;
};

/* One full 8-byte word of the datagram; word 3 is the tag field, read as 0. */
static long hash_word(__u32 i, void *data)
{
	struct hash_ctx *h = data;
	__u64 m = 0;

	if (i != PROTO_TAG_OFF / 8 &&
	    bpf_skb_load_bytes(h->skb, DGRAM_OFF + i * 8, &m, 8) < 0) {
		h->failed = 1;
		return 1;
	}
	sip_block(&h->s, m);
	return 0;
}

/* SipHash-2-4 of the datagram's `len` bytes with the tag field zero;
 * returns -1 if the packet could not be read. */
static __always_inline int siphash_datagram(struct __sk_buff *skb, __u64 k0, __u64 k1, __u32 len, __u64 *out)
{
	struct hash_ctx h = {
		.skb = skb,
		.s = {
			.v0 = k0 ^ 0x736f6d6570736575ULL,
			.v1 = k1 ^ 0x646f72616e646f6dULL,
			.v2 = k0 ^ 0x6c7967656e657261ULL,
			.v3 = k1 ^ 0x7465646279746573ULL,
		},
	};
	__u32 words = len / 8, rem = len % 8;
	__u64 last = (__u64)(len & 0xff) << 56, tail = 0;

	if (words > MAX_HASH_WORDS)
		return -1;
	bpf_loop(words, hash_word, &h, 0);
	if (h.failed)
		return -1;
	/* The last 0-7 bytes, little-endian, under the length byte. The tag
	 * field is whole words, never part of the tail. */
	if (rem) {
		__u32 off = DGRAM_OFF + words * 8;
		/* A constant size per case keeps the verifier's size check simple. */
		switch (rem) {
		case 1: if (bpf_skb_load_bytes(skb, off, &tail, 1) < 0) return -1; break;
		case 2: if (bpf_skb_load_bytes(skb, off, &tail, 2) < 0) return -1; break;
		case 3: if (bpf_skb_load_bytes(skb, off, &tail, 3) < 0) return -1; break;
		case 4: if (bpf_skb_load_bytes(skb, off, &tail, 4) < 0) return -1; break;
		case 5: if (bpf_skb_load_bytes(skb, off, &tail, 5) < 0) return -1; break;
		case 6: if (bpf_skb_load_bytes(skb, off, &tail, 6) < 0) return -1; break;
		default: if (bpf_skb_load_bytes(skb, off, &tail, 7) < 0) return -1; break;
		}
	}
	sip_block(&h.s, last | tail);
	h.s.v2 ^= 0xff;
	sipround(&h.s);
	sipround(&h.s);
	sipround(&h.s);
	sipround(&h.s);
	*out = h.s.v0 ^ h.s.v1 ^ h.s.v2 ^ h.s.v3;
	return 0;
}

/* ---- the replay window (docs/protocol.md), under the member's lock ---- */

static __always_inline int window_accept(struct fanout_member *m, __u64 seq)
{
	int ok = 0;

	if (seq == 0)
		return 0;
	bpf_spin_lock(&m->lock);
	if (seq > m->highest) {
		__u64 shift = seq - m->highest;
		m->bitmap = shift >= 64 ? 0 : m->bitmap << shift;
		m->bitmap |= 1;
		m->highest = seq;
		ok = 1;
	} else {
		__u64 back = m->highest - seq;
		if (back < 64 && !(m->bitmap & (1ULL << back))) {
			m->bitmap |= 1ULL << back;
			ok = 1;
		}
	}
	bpf_spin_unlock(&m->lock);
	return ok;
}

/* ---- the member's rate cap (the security issue's), under its lock ---- */

#define NS_PER_S 1000000000ULL

static __always_inline int rate_take(struct fanout_member *m, __u32 pps, __u32 bps, __u32 len)
{
	/* No helper may be called under the lock: the clock is read first. */
	__u64 now = bpf_ktime_get_ns();
	__u64 pkt_cap = (__u64)pps * NS_PER_S, byte_cap = (__u64)bps * NS_PER_S;
	__u64 need = (__u64)len * NS_PER_S;
	int ok;

	bpf_spin_lock(&m->lock);
	{
		__u64 dt = now - m->rate_last_ns;

		if (dt > NS_PER_S)
			dt = NS_PER_S; /* a second's worth at most: no overflow */
		m->rate_last_ns = now;
		m->rate_pkts += dt * pps;
		if (m->rate_pkts > pkt_cap)
			m->rate_pkts = pkt_cap;
		m->rate_bytes += dt * bps;
		if (m->rate_bytes > byte_cap)
			m->rate_bytes = byte_cap;
		ok = (!pps || m->rate_pkts >= NS_PER_S) && (!bps || m->rate_bytes >= need);
		if (ok) {
			if (pps)
				m->rate_pkts -= NS_PER_S;
			if (bps)
				m->rate_bytes -= need;
		}
	}
	bpf_spin_unlock(&m->lock);
	return ok;
}

/* ---- replication ---- */

/* Ethernet header, IPv4 header, UDP source and destination ports. */
#define HDR_LEN (UDP_DPORT_OFF + 2)

/* Ones' complement sum of two 32-bit words (end-around carry). */
static __always_inline __u32 csum_add32(__u32 sum, __u32 v)
{
	sum += v;
	return sum + (sum < v);
}

/* The IPv4 header checksum after a 32-bit field of the header goes from
 * `from` to `to` (RFC 1624, eqn. 3), all as they are in the packet. The
 * header checksum always covers the whole header (no partial offload for
 * it), so it is computed here and written with the addresses; the UDP
 * checksum is left to bpf_l4_csum_replace, which knows whether the field
 * holds a full sum or only the pseudo-header (CHECKSUM_PARTIAL). */
static __always_inline __u16 ip_check_replace4(__u16 check, __u32 from, __u32 to)
{
	__u32 s = (__u16)~check;

	s = csum_add32(s, ~from);
	s = csum_add32(s, to);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

struct fan_ctx {
	struct __sk_buff *skb;
	struct fanout_group *g;
	__u32 count;
	__u32 cur_ip;     /* destination address now in the packet */
	__u32 cur_sip;    /* source address now in the packet */
	__u16 cur_port;   /* destination port now in the packet */
	__u32 skip_ip;    /* the sender: gets no copy */
	__u16 skip_port;
	__u16 group_port;
	__u32 dlen;       /* datagram bytes, at most FANOUT_RESEND_MAX */
	__u32 gid;
	__u16 ip_check;   /* IPv4 header checksum now in the packet */
	/* The frame up to the UDP destination port as it is now in the packet;
	 * each copy rewrites it with one store. */
	__u8 hdr[HDR_LEN];
	/* Counted straight into the per-CPU map value, not in this struct: the
	 * verifier follows a counter on the stack exactly and would check the
	 * loop body once per value it takes. */
	struct fanout_counters *cnt;
};

/* Copies of this group handed up and not yet dealt with by user space,
 * user space serving its DATA, or a member's LEAVE not yet judged there. */
static __noinline int congested(__u32 gid)
{
	__u64 *q = bpf_map_lookup_elem(&queued, &gid);
	__u64 *done = bpf_map_lookup_elem(&resent, &gid);
	__u64 *h = bpf_map_lookup_elem(&held, &gid);
	__u64 *ls = bpf_map_lookup_elem(&leave_seen, &gid);
	__u64 *ld = bpf_map_lookup_elem(&leave_done, &gid);

	return !q || !done || !h || !ls || !ld || *q != *done || *h || *ls != *ld;
}

/* A LEAVE from a member's address with its ids: fence the group until user
 * space has judged it, so no DATA that arrives after it is fanned out to the
 * leaving member in the kernel. A LEAVE from anyone else changes nothing
 * here (user space answers it as before). */
static __noinline void leave_fence(struct fanout_member_key *mk, __u32 player, __u32 membership, __u32 gid,
				   struct fanout_counters *cnt)
{
	struct fanout_member *m = bpf_map_lookup_elem(&members, mk);
	__u64 *ls;

	if (!m || m->player != player || m->membership != membership)
		return;
	ls = bpf_map_lookup_elem(&leave_seen, &gid);
	if (!ls)
		return;
	__sync_fetch_and_add(ls, 1);
	cnt->leave_fences++;
}

static __noinline void note_queued(__u32 gid, __u64 n)
{
	__u64 *q = bpf_map_lookup_elem(&queued, &gid);

	if (q)
		__sync_fetch_and_add(q, n);
}

/* A copy the stack refused goes to user space, which resends it: a BPF
 * program cannot sleep until the queue drains, as paper 000's sender did. */
static __always_inline void hand_up(struct fan_ctx *c, struct fanout_dest *d)
{
	struct fanout_resend *r = bpf_ringbuf_reserve(&resend, sizeof(*r), 0);
	__u32 len = c->dlen;

	if (!r) {
		c->cnt->lost++;
		return;
	}
	/* dlen is 32..FANOUT_RESEND_MAX (checked before the fan-out); the mask
	 * gives the verifier a bound of 1..FANOUT_RESEND_BUF it can follow. */
	asm volatile("" : "+r"(len));
	len = ((len - 1) & (FANOUT_RESEND_BUF - 1)) + 1;
	r->group = c->group_port;
	r->port = d->port;
	r->ip = d->ip;
	r->len = len;
	r->_pad = 0;
	if (bpf_skb_load_bytes(c->skb, DGRAM_OFF, r->data, len) < 0) {
		bpf_ringbuf_discard(r, 0);
		c->cnt->lost++;
		return;
	}
	bpf_ringbuf_submit(r, 0);
	c->cnt->queued++;
	note_queued(c->gid, 1);
}

static long fan_one(__u32 i, void *data)
{
	struct fan_ctx *c = data;
	struct __sk_buff *skb = c->skb;
	struct fanout_dest *d;

	__u32 idx = i;

	if (i >= c->count)
		return 1;
	/* Clang drops a plain bounds check it can prove redundant and indexes
	 * with an unbounded copy of `i`; a mask it cannot see through keeps the
	 * verifier's bound (FANOUT_MAX_MEMBERS is a power of two). */
	asm volatile("" : "+r"(idx));
	idx &= FANOUT_MAX_MEMBERS - 1;
	d = &c->g->dest[idx];
	if (d->ip == c->skip_ip && d->port == c->skip_port)
		return 0;
	if (d->sip != c->cur_sip) {
		bpf_l4_csum_replace(skb, UDP_CSUM_OFF, c->cur_sip, d->sip,
				    BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4);
		c->ip_check = ip_check_replace4(c->ip_check, c->cur_sip, d->sip);
		c->cur_sip = d->sip;
	}
	if (d->ip != c->cur_ip) {
		bpf_l4_csum_replace(skb, UDP_CSUM_OFF, c->cur_ip, d->ip,
				    BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4);
		c->ip_check = ip_check_replace4(c->ip_check, c->cur_ip, d->ip);
		c->cur_ip = d->ip;
	}
	if (d->port != c->cur_port) {
		bpf_l4_csum_replace(skb, UDP_CSUM_OFF, c->cur_port, d->port, BPF_F_MARK_MANGLED_0 | 2);
		c->cur_port = d->port;
	}
	/* MACs, header checksum, addresses and ports in one write: after a
	 * clone the first write copies the packet's head, and every helper
	 * call that writes checks for that again, so fewer writes are less
	 * work per copy. */
	__builtin_memcpy(c->hdr, d->dmac, 6);
	__builtin_memcpy(c->hdr + 6, d->smac, 6);
	__builtin_memcpy(c->hdr + IP_CSUM_OFF, &c->ip_check, 2);
	__builtin_memcpy(c->hdr + IP_SRC_OFF, &c->cur_sip, 4);
	__builtin_memcpy(c->hdr + IP_DST_OFF, &c->cur_ip, 4);
	__builtin_memcpy(c->hdr + UDP_DPORT_OFF, &c->cur_port, 2);
	bpf_skb_store_bytes(skb, 0, c->hdr, HDR_LEN, 0);
	/* Nonzero: the clone was not queued (NET_XMIT_DROP from a full qdisc
	 * or queue, or an error). */
	if (bpf_clone_redirect(skb, d->ifindex, 0) == 0) {
		c->cnt->copies++;
		c->cnt->bytes_out += c->dlen;
	} else {
		c->cnt->clone_errors++;
		hand_up(c, d);
	}
	return 0;
}

static __always_inline struct fanout_counters *group_counters(__u32 id)
{
	return bpf_map_lookup_elem(&counters, &id);
}

SEC("classifier")
int reflector_fanout(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__u8 *p;
	struct fanout_group *g;
	struct fanout_member *m;
	struct fanout_member_key mk;
	struct fanout_counters *cnt;
	__u32 dlen, src_ip, group_ip, player, membership;
	__u16 src_port, group_port;
	__u64 seq, tag_sent;
	__u32 gid;

	/* Only whole, plain IPv4/UDP frames are ours to judge. */
	if (skb->gso_segs > 1)
		return TCX_NEXT;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TCX_NEXT;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return TCX_NEXT;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF or an offset: a fragment */
		return TCX_NEXT;
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return TCX_NEXT;
	group_port = udp->dest;
	g = bpf_map_lookup_elem(&groups, &group_port);
	if (!g)
		return TCX_NEXT;
	if (g->addr && g->addr != ip->daddr)
		return TCX_NEXT; /* another local address: not the group's socket */
	cnt = group_counters(g->id);
	if (!cnt)
		return TCX_NEXT;
	gid = g->id;
	p = (void *)(udp + 1);
	if ((void *)(p + PROTO_HEADER_LEN) > end)
		goto pass_up;
	dlen = bpf_ntohs(udp->len);
	if (dlen < 8 + PROTO_HEADER_LEN || bpf_ntohs(ip->tot_len) != 20 + dlen)
		goto pass_up;
	dlen -= 8;
	if (p[0] != (PROTO_MAGIC >> 8) || p[1] != (PROTO_MAGIC & 0xff) || p[PROTO_OFF_VERSION] != PROTO_VERSION ||
	    *(__u16 *)(p + PROTO_OFF_GROUP) != group_port ||
	    (((__u32)p[PROTO_OFF_LENGTH] << 8) | p[PROTO_OFF_LENGTH + 1]) != dlen - PROTO_HEADER_LEN)
		goto pass_up;
	mk.ip = ip->saddr;
	mk.port = udp->source;
	mk.group = group_port;
	player = *(__u32 *)(p + PROTO_OFF_SENDER);
	membership = *(__u32 *)(p + PROTO_OFF_MEMBERSHIP);
	/* Judged before the group's mode: user space counts every such LEAVE
	 * it judges, whatever the mode was when it arrived. */
	if (p[PROTO_OFF_KIND] == PROTO_LEAVE) {
		if (dlen == PROTO_LEAVE_LEN)
			leave_fence(&mk, player, membership, gid, cnt);
		goto pass_up;
	}
	if (p[PROTO_OFF_KIND] != PROTO_DATA || dlen < PROTO_DATA_MIN)
		goto pass_up;
	if (dlen > FANOUT_RESEND_MAX)
		goto pass_up; /* a failed copy could not be handed up for resending */
	if (g->flags & GROUP_PASS_UP)
		goto pass_up;
	if (congested(gid))
		goto pass_up; /* user space waits on the full queue, or judges a LEAVE */
	/* The destinations as they are now, not as they were before the fence
	 * was read: user space removes a leaver from the list before it counts
	 * the LEAVE judged, so a list read after an open fence never holds a
	 * member whose LEAVE was judged. The element read above may be older
	 * (this CPU can stop between the two reads while a LEAVE is judged). */
	g = bpf_map_lookup_elem(&groups, &group_port);
	if (!g || g->id != gid || (g->flags & GROUP_PASS_UP))
		goto pass_up;

	m = bpf_map_lookup_elem(&members, &mk);
	if (!m)
		goto pass_up; /* not a member: user space answers ERROR(NotMember) */
	if (player != m->player || membership != m->membership)
		goto pass_up; /* an earlier membership: user space counts it */
	seq = bpf_be64_to_cpu(*(__u64 *)(p + PROTO_OFF_SEQ));
	src_ip = ip->saddr;
	src_port = udp->source;
	group_ip = ip->daddr;

	if (g->flags & GROUP_TAGS) {
		__u64 want;

		if ((void *)(p + PROTO_DATA_MIN) > end)
			goto pass_up;
		tag_sent = bpf_be64_to_cpu(*(__u64 *)(p + PROTO_TAG_OFF));
		if (siphash_datagram(skb, m->k0, m->k1, dlen, &want) < 0)
			goto pass_up;
		if (want != tag_sent) {
			cnt->bad_tag++;
			return TCX_DROP;
		}
		/* Only a datagram whose tag verified moves the window, and only
		 * such DATA is a sign of life (as in user space, where untagged
		 * DATA neither checks nor moves the window). */
		if (!window_accept(m, seq)) {
			cnt->replays++;
			return TCX_DROP;
		}
		__sync_fetch_and_add(&m->data_in, 1);
	}
	/* Beyond its cap a member's own DATA is dropped, nobody else's. */
	if ((g->pps || g->bps) && !rate_take(m, g->pps, g->bps, dlen)) {
		cnt->rate_limited++;
		return TCX_DROP;
	}

	/* Every copy carries the tag field zeroed, from the group's address. */
	if (g->flags & GROUP_TAGS) {
		__u32 old_hi, old_lo, zero = 0;
		__u64 zero8 = 0;

		if (bpf_skb_load_bytes(skb, DGRAM_OFF + PROTO_TAG_OFF, &old_hi, 4) < 0 ||
		    bpf_skb_load_bytes(skb, DGRAM_OFF + PROTO_TAG_OFF + 4, &old_lo, 4) < 0)
			return TCX_DROP;
		bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_hi, zero, BPF_F_MARK_MANGLED_0 | 4);
		bpf_l4_csum_replace(skb, UDP_CSUM_OFF, old_lo, zero, BPF_F_MARK_MANGLED_0 | 4);
		bpf_skb_store_bytes(skb, DGRAM_OFF + PROTO_TAG_OFF, &zero8, 8, 0);
	}
	/* Source addresses are set per destination (each copy leaves from the
	 * address the group's socket would use towards that member). */
	bpf_l4_csum_replace(skb, UDP_CSUM_OFF, src_port, group_port, BPF_F_MARK_MANGLED_0 | 2);
	bpf_skb_store_bytes(skb, UDP_SPORT_OFF, &group_port, 2, 0);

	{
		struct fan_ctx c = {
			.skb = skb,
			.g = g,
			.count = g->count,
			.cur_ip = group_ip,
			.cur_sip = src_ip,
			.cur_port = group_port,
			.skip_ip = src_ip,
			.skip_port = src_port,
			.group_port = group_port,
			.dlen = dlen,
			.gid = gid,
			.cnt = cnt,
		};

		/* Cannot fail: the headers were read above. Counted if it did. */
		if (bpf_skb_load_bytes(skb, 0, c.hdr, HDR_LEN) < 0) {
			cnt->lost++;
			return TCX_DROP;
		}
		__builtin_memcpy(&c.ip_check, c.hdr + IP_CSUM_OFF, 2);
		if (c.count > FANOUT_MAX_MEMBERS)
			c.count = FANOUT_MAX_MEMBERS;
		bpf_loop(c.count, fan_one, &c, 0);
		/* Per-CPU counters: no atomics needed. */
		cnt->forwarded++;
		cnt->bytes_in += dlen;
	}
	return TCX_DROP;

pass_up:
	cnt->passed_up++;
	return TCX_NEXT;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
