/* Cluster-in-a-box check (tests/cluster/cluster_test.sh): run under `cluster.sh run`.
 *
 *   mpi_nodes MIB [ONEWAY_MIB]
 *
 * Every rank prints one line
 *   rank R node_comm_size S host H netns N env V
 * (S from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), H from gethostname, N the inode of
 * /proc/self/ns/net, V the value of GG_CLUSTER_TEST_ENV or "-": does the environment reach
 * the ranks).  Then each rank sends MIB MiB to the rank one node further on
 * (rank + S, cyclic) and receives as many from the rank one node back, and checks every
 * byte against a pattern of the sender and the offset; a mismatch ends the job with
 * exit 1.  With ONEWAY_MIB > 0, rank 0 then sends ONEWAY_MIB MiB to rank S (the first
 * rank of the next node), which answers with one byte, and rank 0 prints
 *   oneway BYTES SECONDS MBITS
 * (the time from the send to the answer).  The last line, from rank 0, is "ok". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static unsigned char pattern(int sender, size_t i) {
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ULL + (uint64_t)(sender + 1) * 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 29;
    return (unsigned char)(x ^ (x >> 17));
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpi_nodes MIB [ONEWAY_MIB]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    size_t oneway = argc > 2 ? (size_t)atol(argv[2]) << 20 : 0;

    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int nsize;
    MPI_Comm_size(node, &nsize);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    struct stat st;
    unsigned long netns = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long)st.st_ino : 0;
    const char *env = getenv("GG_CLUSTER_TEST_ENV");
    printf("rank %d node_comm_size %d host %s netns %lu env %s\n", rank, nsize, host, netns,
           env && *env ? env : "-");
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);

    unsigned char *out = malloc(n ? n : 1), *in = malloc(n ? n : 1);
    if (!out || !in) MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < n; i++) out[i] = pattern(rank, i);
    memset(in, 0, n);
    int to = (rank + nsize) % size, from = (rank - nsize % size + size) % size;
    MPI_Request rq[2];
    MPI_Irecv(in, (int)n, MPI_BYTE, from, 1, MPI_COMM_WORLD, &rq[0]);
    MPI_Isend(out, (int)n, MPI_BYTE, to, 1, MPI_COMM_WORLD, &rq[1]);
    MPI_Status sts[2];
    MPI_Waitall(2, rq, sts);
    for (size_t i = 0; i < n; i++)
        if (in[i] != pattern(from, i)) {
            fprintf(stderr, "rank %d: byte %zu from rank %d is %d, expected %d\n", rank, i, from,
                    in[i], pattern(from, i));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    free(out);
    free(in);

    if (oneway > 0 && size > nsize) {
        unsigned char *buf = malloc(oneway), ack = 0;
        if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
        memset(buf, 0x5a, oneway);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            double t0 = MPI_Wtime();
            MPI_Send(buf, (int)oneway, MPI_BYTE, nsize, 2, MPI_COMM_WORLD);
            MPI_Recv(&ack, 1, MPI_BYTE, nsize, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            double dt = MPI_Wtime() - t0;
            printf("oneway %zu %.6f %.1f\n", oneway, dt, oneway * 8 / dt / 1e6);
        } else if (rank == nsize) {
            MPI_Recv(buf, (int)oneway, MPI_BYTE, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (size_t i = 0; i < oneway; i++)
                if (buf[i] != 0x5a) MPI_Abort(MPI_COMM_WORLD, 1);
            MPI_Send(&ack, 1, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
        }
        free(buf);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("ok\n");
    fflush(stdout);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
}
