// SPDX-License-Identifier: GPL-2.0 OR MIT
/* A counting sink for measurements: every DATA datagram of our protocol
 * (IPv4/UDP, magic and type at fixed offsets) is counted and taken away;
 * everything else goes on. On a device's egress it stands in for the wire
 * (what the reflector sends is counted and costs no receiver any work): the
 * datagram is redirected to a device that frees it (a dummy, or a veth
 * whose peer is down), because a drop
 * on egress would be reported to the sending socket as ENOBUFS and a
 * reflector that never loses a datagram would resend it forever. On its
 * ingress, attached first, it is the anchor (what the clients' sending
 * costs, before any reflector sees it): there a drop is silent. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* The protocol's magic, the DATA type and the type's offset
 * (docs/protocol.md): generated from reflector-proto by build.rs. */
#include "reflector_proto.h"

#ifndef TCX_NEXT
#define TCX_NEXT -1
#define TCX_DROP 2
#endif

/* The dummy device's ifindex, 0 to drop instead (ingress). */
volatile const __u32 sink_ifindex = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} sunk SEC(".maps");

SEC("classifier")
int reflector_sink(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__u8 *p;
	__u32 zero = 0;
	__u64 *n;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return TCX_NEXT;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
		return TCX_NEXT;
	udp = (void *)(ip + 1);
	p = (void *)(udp + 1);
	if ((void *)(p + PROTO_OFF_KIND + 1) > end)
		return TCX_NEXT;
	if (p[0] != (PROTO_MAGIC >> 8) || p[1] != (PROTO_MAGIC & 0xff) || p[PROTO_OFF_KIND] != PROTO_DATA)
		return TCX_NEXT;
	n = bpf_map_lookup_elem(&sunk, &zero);
	if (n)
		(*n)++;
	if (sink_ifindex)
		return bpf_redirect(sink_ifindex, 0);
	return TCX_DROP;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
