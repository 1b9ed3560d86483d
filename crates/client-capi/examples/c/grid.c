/* A few players on a 16x16 grid, each a reflector client (one handle per
 * player, all in this process): every 50 ms each takes a step and sends
 * its position to the group; each prints what it hears. One game loop
 * drives them all with rc_update, as a game would once per frame.
 *
 *   grid [--owed K:N] REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX ...
 *
 * REFLECTOR is "host:port"; each player's token and session key come from
 * the control server (in a game: from the game's backend), in hex. It runs
 * SECONDS, then prints a line "heard ME OTHER" for every player OTHER that
 * player ME heard, and exits 0 (1 on an error).
 *
 * Checkpoints: when the reflector asks a player for the game's state, the
 * player hands in STATE_LEN bytes made from its id and its tick (the frame
 * number) and prints "uploaded ME number N tick T size S" once stored. A
 * player that joins a group with a checkpoint fetches it (the library does
 * on each join) and prints "checkpoint ME from P number N tick T size S
 * fnv1a H" (H: the state's 64-bit FNV-1a, in hex).
 *
 * --owed K:N: once a player has heard N-1 others (every player of the
 * group is a member then), it sends K numbered datagrams "n SEQ" (one a
 * frame) and then "done"; it prints "got ME SENDER SEQ" for each numbered
 * datagram it receives, and stops (printing "complete ME") once its own
 * are out and every other player's "done" came, or at SECONDS.
 *
 * Build: cc -I crates/client-capi/include grid.c -L DIR -lreflector_c
 */
#include "reflector_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PLAYERS 8
#define MAX_HEARD 64
#define GRID 16
#define STATE_LEN 20000

typedef struct {
    rc_handle h;
    uint32_t id;
    int x, y;
    uint32_t heard[MAX_HEARD];
    int n_heard;
    uint64_t tick;          /* frames played: the tick of the game state */
    int owed_sent;          /* --owed: numbered datagrams sent so far */
    int done_sent;
    uint32_t done_from[MAX_HEARD];
    int n_done;
    int complete;
} player;

static uint8_t state[STATE_LEN];

static void die(const char *what, rc_status st) {
    char msg[512];
    rc_last_error(msg, sizeof msg);
    fprintf(stderr, "grid: %s failed (%d): %s\n", what, (int)st, msg);
    exit(1);
}

static int unhex(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void add_once(uint32_t *set, int *n, uint32_t v) {
    for (int i = 0; i < *n; i++)
        if (set[i] == v) return;
    if (*n < MAX_HEARD) set[(*n)++] = v;
}

/* The game state at a tick: made from the player and the tick, so that a
 * joiner can tell it got exactly these bytes. */
static void make_state(uint32_t id, uint64_t tick, uint8_t *out, size_t len) {
    for (size_t i = 0; i < len; i++) out[i] = (uint8_t)((i * 7 + (i >> 8) + (uint64_t)id * 13 + tick) & 0xff);
}

static uint64_t fnv1a(const uint8_t *b, size_t len) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* One checkpoint event: answer a request with the state, print an upload
 * stored, copy a fetched state out (asking its size first). */
static void on_checkpoint(player *p, const rc_checkpoint_event *ev) {
    rc_status st;
    switch (ev->kind) {
    case RC_CHECKPOINT_REQUESTED:
        make_state(p->id, p->tick, state, sizeof state);
        st = rc_provide_checkpoint(p->h, p->tick, state, sizeof state); /* copied: state is ours again */
        if (st != RC_OK) {
            char msg[512];
            rc_last_error(msg, sizeof msg);
            printf("player %u: no upload (%d): %s\n", p->id, (int)st, msg);
        }
        break;
    case RC_CHECKPOINT_UPLOADED:
        printf("uploaded %u number %llu tick %llu size %d\n", p->id, (unsigned long long)ev->number,
               (unsigned long long)ev->tick, STATE_LEN);
        break;
    case RC_CHECKPOINT_READY: {
        size_t len = 0;
        uint64_t tick = 0;
        st = rc_checkpoint_take(p->h, NULL, 0, &len, &tick); /* its size */
        if (st != RC_ERR_BUFFER_TOO_SMALL && st != RC_OK) die("rc_checkpoint_take (size)", st);
        uint8_t *buf = malloc(len ? len : 1);
        if (!buf) die("malloc", RC_ERR_TOO_LARGE);
        if (len && (st = rc_checkpoint_take(p->h, buf, len, &len, &tick)) != RC_OK) die("rc_checkpoint_take", st);
        printf("checkpoint %u from %u number %llu tick %llu size %zu fnv1a %016llx\n", p->id, ev->from_player,
               (unsigned long long)ev->number, (unsigned long long)tick, len, (unsigned long long)fnv1a(buf, len));
        free(buf);
        break;
    }
    case RC_CHECKPOINT_EMPTY:
        printf("player %u: the group has no checkpoint yet\n", p->id);
        break;
    case RC_CHECKPOINT_FAILED: {
        char msg[512];
        rc_last_error(msg, sizeof msg);
        printf("player %u: checkpoint %s failed (%d, refusal %u): %s\n", p->id,
               ev->op == RC_CHECKPOINT_OP_UPLOAD ? "upload" : "fetch", (int)ev->error, (unsigned)ev->refusal, msg);
        break;
    }
    default:
        break;
    }
}

int main(int argc, char **argv) {
    int owed = 0, group_size = 0;
    if (argc > 2 && strcmp(argv[1], "--owed") == 0) {
        if (sscanf(argv[2], "%d:%d", &owed, &group_size) != 2 || owed < 0 || group_size < 1 ||
            group_size > MAX_HEARD) {
            fprintf(stderr, "grid: --owed K:N wants two numbers\n");
            return 2;
        }
        argc -= 2;
        argv += 2;
    }
    if (argc < 4 || argc - 3 > MAX_PLAYERS) {
        fprintf(stderr,
                "usage: grid [--owed K:N] REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX ... (1 to %d "
                "players)\n",
                MAX_PLAYERS);
        return 2;
    }
    if ((rc_version() >> 16) != REFLECTOR_C_VERSION_MAJOR) {
        fprintf(stderr, "grid: library major version %u, header %d\n", rc_version() >> 16,
                REFLECTOR_C_VERSION_MAJOR);
        return 1;
    }
    const char *reflector = argv[1];
    long seconds = atol(argv[2]);
    int n = argc - 3;
    player players[MAX_PLAYERS];
    memset(players, 0, sizeof players);

    for (int i = 0; i < n; i++) {
        char spec[256], *tok[5], *save = NULL;
        snprintf(spec, sizeof spec, "%s", argv[3 + i]);
        int k = 0;
        for (char *s = strtok_r(spec, ":", &save); s && k < 5; s = strtok_r(NULL, ":", &save)) tok[k++] = s;
        uint8_t token[RC_TOKEN_LEN], key[RC_SESSION_KEY_LEN];
        if (k != 5 || unhex(tok[3], token, sizeof token) || unhex(tok[4], key, sizeof key)) {
            fprintf(stderr, "grid: bad player spec '%s'\n", argv[3 + i]);
            return 2;
        }
        player *p = &players[i];
        p->id = (uint32_t)strtoul(tok[0], NULL, 10);
        p->x = i * 3 % GRID;
        p->y = i * 5 % GRID;
        rc_status st = rc_client_new_with_token(token, sizeof token, key, sizeof key, p->id,
                                                (uint16_t)atoi(tok[1]), reflector,
                                                strtoull(tok[2], NULL, 10), NULL, &p->h);
        if (st != RC_OK) die("rc_client_new_with_token", st);
    }

    uint64_t start = rc_now_ms(), last_move = 0;
    uint8_t buf[RC_MAX_PAYLOAD];
    uint64_t all_complete_at = 0;
    while (rc_now_ms() - start < (uint64_t)seconds * 1000) {
        uint64_t now = rc_now_ms();
        int move = now - last_move >= 50;
        if (move) last_move = now;
        int complete = 0;
        for (int i = 0; i < n; i++) {
            player *p = &players[i];
            p->tick++;
            rc_status st = rc_update(p->h, now);
            if (st != RC_OK) die("rc_update", st);

            rc_checkpoint_event ce;
            while ((st = rc_poll_checkpoint(p->h, &ce)) == RC_OK) on_checkpoint(p, &ce);
            if (st != RC_NONE) die("rc_poll_checkpoint", st);

            rc_event ev;
            while ((st = rc_poll_event(p->h, &ev)) == RC_OK) {
                if (ev.kind == RC_EVENT_JOINED) {
                    printf("player %u joined group %u (%u members)\n", p->id, ev.group, ev.members);
                } else if (ev.kind == RC_EVENT_ERROR) {
                    char msg[512];
                    rc_last_error(msg, sizeof msg);
                    printf("player %u: error %d: %s\n", p->id, (int)ev.error, msg);
                }
            }
            if (st != RC_NONE) die("rc_poll_event", st);

            rc_datagram_info info;
            while ((st = rc_recv(p->h, buf, sizeof buf, &info)) == RC_OK) {
                int x = -1, y = -1;
                char text[64];
                size_t len = info.len < sizeof text - 1 ? info.len : sizeof text - 1;
                memcpy(text, buf, len);
                text[len] = 0;
                unsigned long long k;
                if (sscanf(text, "pos %d %d", &x, &y) == 2) {
                    printf("player %u hears player %u at (%d, %d), seq %llu\n", p->id, info.sender, x, y,
                           (unsigned long long)info.seq);
                } else if (sscanf(text, "n %llu", &k) == 1) {
                    printf("got %u %u %llu\n", p->id, info.sender, k);
                } else if (strcmp(text, "done") == 0) {
                    add_once(p->done_from, &p->n_done, info.sender);
                }
                add_once(p->heard, &p->n_heard, info.sender);
            }
            if (st != RC_NONE) die("rc_recv", st);

            /* --owed: everyone is a member once all the others were heard. */
            if (group_size && p->n_heard >= group_size - 1 && rc_is_member(p->h) == 1) {
                if (p->owed_sent < owed) {
                    char msg[32];
                    int len = snprintf(msg, sizeof msg, "n %d", p->owed_sent);
                    st = rc_send(p->h, (const uint8_t *)msg, (size_t)len, NULL);
                    if (st != RC_OK) die("rc_send", st);
                    p->owed_sent++;
                } else if (!p->done_sent) {
                    st = rc_send(p->h, (const uint8_t *)"done", 4, NULL);
                    if (st != RC_OK) die("rc_send", st);
                    p->done_sent = 1;
                }
            }
            if (group_size && p->done_sent && p->n_done >= group_size - 1 && !p->complete) {
                p->complete = 1;
                printf("complete %u\n", p->id);
            }
            complete += p->complete;

            if (move && rc_is_member(p->h) == 1) {
                /* A step along a fixed walk: right, then down at the edge. */
                p->x = (p->x + 1) % GRID;
                if (p->x == 0) p->y = (p->y + 1) % GRID;
                char msg[32];
                int len = snprintf(msg, sizeof msg, "pos %d %d", p->x, p->y);
                st = rc_send(p->h, (const uint8_t *)msg, (size_t)len, NULL);
                if (st != RC_OK) die("rc_send", st);
            }
        }
        /* --owed: all sending is over once every player is complete; a
         * moment more for stragglers, then leave. */
        if (group_size && complete == n) {
            if (!all_complete_at) all_complete_at = now;
            if (now - all_complete_at >= 300) break;
        }
        sleep_ms(5);
    }

    for (int i = 0; i < n; i++) {
        rc_client_stats s;
        if (rc_stats(players[i].h, &s) == RC_OK)
            printf("player %u: sent %llu, received %llu\n", players[i].id, (unsigned long long)s.data_sent,
                   (unsigned long long)s.data_received);
        for (int j = 0; j < players[i].n_heard; j++) printf("heard %u %u\n", players[i].id, players[i].heard[j]);
        rc_checkpoint_counters cs;
        if (rc_checkpoint_stats(players[i].h, &cs) == RC_OK && (cs.requested || cs.fetched || cs.failures))
            printf("player %u: checkpoints requested %llu, uploaded %llu, fetched %llu, failed %llu\n",
                   players[i].id, (unsigned long long)cs.requested, (unsigned long long)cs.uploaded,
                   (unsigned long long)cs.fetched, (unsigned long long)cs.failures);
        rc_status st = rc_free(players[i].h);
        if (st != RC_OK) die("rc_free", st);
        /* A handle is dead once freed: using it again is an error, not a crash. */
        if (rc_free(players[i].h) != RC_ERR_BAD_HANDLE) {
            fprintf(stderr, "grid: a double free was not refused\n");
            return 1;
        }
    }
    fflush(stdout);
    return 0;
}
