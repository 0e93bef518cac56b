/* Latency probes for bench/ls_latency.py, built static so they run in the busybox test image.
 *
 *   ls_probe probe ROUNDS SLEEP_US WORK_US   sleep, then a fixed amount of work calibrated to
 *                                            WORK_US; prints how late each round finished
 *   ls_probe server PORT WORK_US             TCP: for each 64-byte request, WORK_US of work, reply
 *   ls_probe client HOST PORT ROUNDS GAP_US  round trips against the server, GAP_US apart
 *   ls_probe spin                            one busy loop (the BE load)
 *   ls_probe duty PERCENT                    PERCENT of a CPU: that share of every 10 ms as CPU
 *                                            time, asleep the rest (the LS pod's own load, "LS busy")
 *
 * probe and client print one line: "p50_us p99_us p999_us max_us rounds" (microseconds); the
 * client adds key=value fields saying where its slowest round trips went (below).
 *
 * Where a round trip's time went: both ends read their own scheduling delay, the run_delay of
 * /proc/thread-self/schedstat (ns a task was runnable but waited for a CPU). The client takes it
 * before sending and after the reply (its wake-up when the reply arrives, and any preemption);
 * a request whose first byte is 'S' asks the server for its own: the delay from the end of its
 * previous reply to just before this reply (its wake-up on the request and any preemption
 * during the work), sent back in bytes 8..15 of the reply. A request without 'S' costs the
 * server nothing extra; with it, two small reads of that file per request.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static volatile uint64_t sink;

static void work(uint64_t iterations) {
    uint64_t x = sink;
    for (uint64_t i = 0; i < iterations; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink = x;
}

/* Iterations that take work_us on an uncontended CPU: the fastest of several tries. */
static uint64_t calibrate(int work_us) {
    uint64_t n = 100000;
    int64_t best = INT64_MAX;
    for (int i = 0; i < 50; i++) {
        int64_t t0 = now_ns();
        work(n);
        int64_t dt = now_ns() - t0;
        if (dt < best) best = dt;
    }
    return (uint64_t)((double)n * work_us * 1000.0 / (double)best);
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void report(int64_t *lat, int n) {
    qsort(lat, n, sizeof *lat, cmp64);
    printf("%.1f %.1f %.1f %.1f %d\n", lat[n / 2] / 1e3, lat[(int)(n * 0.99)] / 1e3,
           lat[(int)(n * 0.999)] / 1e3, lat[n - 1] / 1e3, n);
    fflush(stdout);
}

/* This thread's run_delay (ns waiting for a CPU while runnable), or -1 when the kernel has no
 * schedstat (CONFIG_SCHED_INFO off). fd: /proc/thread-self/schedstat, opened once. */
static int64_t run_delay_ns(int fd) {
    char text[96];
    if (fd < 0) return -1;
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    if (n <= 0) return -1;
    text[n] = 0;
    long long exec_ns, delay_ns;
    return sscanf(text, "%lld %lld", &exec_ns, &delay_ns) == 2 ? (int64_t)delay_ns : -1;
}

static int open_schedstat(void) { return open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC); }

static int probe(int rounds, int sleep_us, int work_us) {
    uint64_t iters = calibrate(work_us);
    int64_t *lat = calloc(rounds, sizeof *lat);
    struct timespec req = {0, (long)sleep_us * 1000};
    for (int i = 0; i < rounds; i++) {
        int64_t t0 = now_ns();
        nanosleep(&req, NULL);
        work(iters);
        int64_t late = now_ns() - t0 - (int64_t)(sleep_us + work_us) * 1000;
        lat[i] = late < 0 ? 0 : late;
    }
    report(lat, rounds);
    return 0;
}

static int server(int port, int work_us) {
    uint64_t iters = calibrate(work_us);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 8)) { perror("bind/listen"); return 1; }
    int stat_fd = open_schedstat();
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char buf[64];
        int64_t since = run_delay_ns(stat_fd); /* at the end of the previous reply */
        for (;;) {
            ssize_t got = 0, r;
            while (got < 64 && (r = read(c, buf + got, 64 - got)) > 0) got += r;
            if (got < 64) break;
            work(iters);
            int report_delay = buf[0] == 'S';
            if (report_delay) {
                int64_t now = run_delay_ns(stat_fd);
                int64_t waited = now < 0 || since < 0 ? -1 : now - since;
                memcpy(buf + 8, &waited, sizeof waited);
            }
            if (write(c, buf, 64) != 64) break;
            if (report_delay) since = run_delay_ns(stat_fd);
        }
        close(c);
    }
}

struct round { int64_t rtt, client_wait, server_wait; };

static int by_rtt(const void *a, const void *b) {
    int64_t x = ((const struct round *)a)->rtt, y = ((const struct round *)b)->rtt;
    return (x > y) - (x < y);
}

/* Means over rounds[from..n) (sorted by rtt), in us: "rtt_KEY=.. client_wait_KEY=.. server_wait_KEY=..". */
static void print_where(const char *key, const struct round *rounds, int from, int n) {
    double rtt = 0, cw = 0, sw = 0;
    int known_c = 1, known_s = 1;
    for (int i = from; i < n; i++) {
        rtt += rounds[i].rtt;
        cw += rounds[i].client_wait;
        sw += rounds[i].server_wait;
        known_c &= rounds[i].client_wait >= 0;
        known_s &= rounds[i].server_wait >= 0;
    }
    int k = n - from > 0 ? n - from : 1;
    printf(" rtt_%s=%.1f client_wait_%s=%.1f server_wait_%s=%.1f", key, rtt / k / 1e3, key,
           known_c ? cw / k / 1e3 : -1.0, key, known_s ? sw / k / 1e3 : -1.0);
}

static int exchange(int s, char *buf) {
    buf[0] = 'S'; /* ask for the server's scheduling delay */
    if (write(s, buf, 64) != 64) { perror("write"); return -1; }
    ssize_t got = 0, r;
    while (got < 64 && (r = read(s, buf + got, 64 - got)) > 0) got += r;
    if (got < 64) { fprintf(stderr, "short reply\n"); return -1; }
    return 0;
}

static int client(const char *host, int port, int rounds, int gap_us) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &addr.sin_addr);
    for (int tries = 0; connect(s, (struct sockaddr *)&addr, sizeof addr); tries++) {
        if (tries > 100) { perror("connect"); return 1; }
        close(s);
        s = socket(AF_INET, SOCK_STREAM, 0);
        usleep(50000);
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int stat_fd = open_schedstat();
    struct round *lat = calloc(rounds, sizeof *lat);
    int64_t *rtt = calloc(rounds, sizeof *rtt);
    char buf[64] = {0};
    struct timespec gap = {0, (long)gap_us * 1000};
    if (exchange(s, buf)) return 1; /* one round not counted: the server's first delay spans the accept */
    nanosleep(&gap, NULL);
    for (int i = 0; i < rounds; i++) {
        int64_t d0 = run_delay_ns(stat_fd);
        int64_t t0 = now_ns();
        if (exchange(s, buf)) return 1;
        lat[i].rtt = rtt[i] = now_ns() - t0;
        int64_t d1 = run_delay_ns(stat_fd);
        lat[i].client_wait = d0 < 0 || d1 < 0 ? -1 : d1 - d0;
        memcpy(&lat[i].server_wait, buf + 8, sizeof lat[i].server_wait);
        nanosleep(&gap, NULL);
    }
    qsort(rtt, rounds, sizeof *rtt, cmp64);
    printf("%.1f %.1f %.1f %.1f %d", rtt[rounds / 2] / 1e3, rtt[(int)(rounds * 0.99)] / 1e3,
           rtt[(int)(rounds * 0.999)] / 1e3, rtt[rounds - 1] / 1e3, rounds);
    qsort(lat, rounds, sizeof *lat, by_rtt);
    print_where("all", lat, 0, rounds);
    print_where("p99", lat, (int)(rounds * 0.99), rounds);
    print_where("p999", lat, (int)(rounds * 0.999), rounds);
    printf("\n");
    fflush(stdout);
    return 0;
}

static int64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Uses percent of a CPU: in each 10 ms period, works until it has had percent of the period as
 * CPU time (or the period is over: with less CPU it gets less done), then sleeps to the period's
 * end. */
static void duty(int percent) __attribute__((noreturn));
static void duty(int percent) {
    const int64_t period = 10000000;
    int64_t start = now_ns();
    for (;;) {
        int64_t cpu0 = cpu_ns();
        while (cpu_ns() - cpu0 < period * percent / 100 && now_ns() - start < period) work(2000);
        start += period;
        struct timespec until = {start / 1000000000LL, start % 1000000000LL};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
        if (now_ns() - start > period) start = now_ns();  /* fell behind: a new period from now */
    }
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "probe")) return probe(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc >= 4 && !strcmp(argv[1], "server")) return server(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 6 && !strcmp(argv[1], "client")) return client(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc >= 2 && !strcmp(argv[1], "spin")) { for (;;) work(1000000); }
    if (argc >= 3 && !strcmp(argv[1], "duty")) duty(atoi(argv[2]));
    fprintf(stderr, "usage: ls_probe probe ROUNDS SLEEP_US WORK_US | server PORT WORK_US | "
                    "client HOST PORT ROUNDS GAP_US | spin | duty PERCENT\n");
    return 2;
}
