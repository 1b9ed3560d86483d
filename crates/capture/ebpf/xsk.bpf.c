// SPDX-License-Identifier: GPL-2.0 OR MIT
/* capture's AF_XDP mode: every frame received on the monitor interface is
 * handed to the capture socket bound to its receive queue (the XSK map is
 * indexed by queue). Nothing goes on to the stack: the interface is a
 * mirror or SPAN port whose only reader is the capture.
 *
 * In front of each frame the program puts a small header in the XDP
 * metadata area (copied with the frame in copy mode too): a magic word and
 * the time of reception on the kernel's TAI clock, which user space turns
 * into wall-clock time (AF_XDP itself carries no timestamp).
 *
 * Per queue it counts the frames it saw and the frames it could not hand
 * to a socket (none bound on that queue); frames a socket could not take
 * (full ring, no free buffer) are counted by the socket itself. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define CAPTURE_MAX_QUEUES 256
#define CAPTURE_META_MAGIC 0x43505458u /* "XTPC" */

struct capture_meta {
	__u32 magic;
	__u32 pad;
	__u64 tai_ns;
};

struct capture_queue_counts {
	__u64 seen;
	__u64 no_socket;
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, CAPTURE_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} capture_xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CAPTURE_MAX_QUEUES);
	__type(key, __u32);
	__type(value, struct capture_queue_counts);
} capture_counts SEC(".maps");

SEC("xdp")
int capture_xsk(struct xdp_md *ctx)
{
	__u32 queue = ctx->rx_queue_index;
	struct capture_queue_counts *counts = bpf_map_lookup_elem(&capture_counts, &queue);

	if (counts)
		counts->seen++;
	/* A device that cannot carry metadata leaves the header out; user
	 * space then stamps the frame when it reads it. */
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct capture_meta)) == 0) {
		void *data = (void *)(long)ctx->data;
		struct capture_meta *meta = (void *)(long)ctx->data_meta;

		if ((void *)(meta + 1) <= data) {
			meta->magic = CAPTURE_META_MAGIC;
			meta->pad = 0;
			meta->tai_ns = bpf_ktime_get_tai_ns();
		}
	}
	/* The low bits of the flags are the action when the queue has no
	 * socket: XDP_ABORTED, which tells us to count the frame. */
	long action = bpf_redirect_map(&capture_xsks, queue, XDP_ABORTED);
	if (action == XDP_REDIRECT)
		return XDP_REDIRECT;
	if (counts)
		counts->no_socket++;
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
