/* A few players on a 16x16 grid, each a reflector client (one handle per
 * player, all in this process): every 50 ms each takes a step and sends
 * its position to the group; each prints what it hears. One game loop
 * drives them all with rc_update, as a game would once per frame.
 *
 *   grid REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX ...
 *
 * REFLECTOR is "host:port"; each player's token and session key come from
 * the control server (in a game: from the game's backend), in hex. It runs
 * SECONDS, then prints a line "heard ME OTHER" for every player OTHER that
 * player ME heard, and exits 0 (1 on an error).
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

typedef struct {
    rc_handle h;
    uint32_t id;
    int x, y;
    uint32_t heard[MAX_HEARD];
    int n_heard;
} player;

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

static void heard(player *p, uint32_t sender) {
    for (int i = 0; i < p->n_heard; i++)
        if (p->heard[i] == sender) return;
    if (p->n_heard < MAX_HEARD) p->heard[p->n_heard++] = sender;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > MAX_PLAYERS) {
        fprintf(stderr, "usage: grid REFLECTOR SECONDS PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX ... (1 to %d players)\n",
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
    while (rc_now_ms() - start < (uint64_t)seconds * 1000) {
        uint64_t now = rc_now_ms();
        int move = now - last_move >= 50;
        if (move) last_move = now;
        for (int i = 0; i < n; i++) {
            player *p = &players[i];
            rc_status st = rc_update(p->h, now);
            if (st != RC_OK) die("rc_update", st);

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
                if (sscanf(text, "pos %d %d", &x, &y) == 2) {
                    printf("player %u hears player %u at (%d, %d), seq %llu\n", p->id, info.sender, x, y,
                           (unsigned long long)info.seq);
                }
                heard(p, info.sender);
            }
            if (st != RC_NONE) die("rc_recv", st);

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
        sleep_ms(5);
    }

    for (int i = 0; i < n; i++) {
        rc_client_stats s;
        if (rc_stats(players[i].h, &s) == RC_OK)
            printf("player %u: sent %llu, received %llu\n", players[i].id, (unsigned long long)s.data_sent,
                   (unsigned long long)s.data_received);
        for (int j = 0; j < players[i].n_heard; j++) printf("heard %u %u\n", players[i].id, players[i].heard[j]);
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
