// spin: the CUDA runtime-API workload of the real-GPU validation (validate.sh).
//
// Built on the device machine at run time (`nvcc -O2 -arch=sm_90 -o spin spin.cu`); it reaches
// the driver the way most applications do: the static CUDA runtime resolves every driver entry
// point through cuGetProcAddress, so it exercises the shim's proc-address path.
//
// Modes (each prints ONE `RESULT {json}` line on stdout, as the Python helpers do, for
// evaluate.py; errors go to stderr with exit code 1):
//   spin   [--seconds S] [--cycles C] [--ready F --go G]
//          compute-bound: back-to-back full-GPU kernels that each spin C clock cycles on every
//          SM (keeping FMA units busy), for S seconds after a 1 s warm-up. Reports kernels/s.
//          --ready/--go: after the warm-up, create F and wait (at most 60 s) for G to exist, so
//          several processes start their measured phase together.
//   launch [--count N] [--reps R]   empty-kernel launch rate (launches/s, median of R).
//   alloc  [--count N] [--reps R] [--bytes B]  cudaMalloc+cudaFree pairs per second (median).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            std::fprintf(stderr, "spin: %s failed: %s (%d) at line %d\n", #call,      \
                         cudaGetErrorString(err_), static_cast<int>(err_), __LINE__); \
            std::exit(1);                                                             \
        }                                                                             \
    } while (0)

// Spins `cycles` SM clock cycles with dependent FMAs so the SM is busy, not just waiting;
// the store keeps the compiler from removing the arithmetic.
__global__ void spin_kernel(long long cycles, float *sink) {
    long long start = clock64();
    float a = threadIdx.x * 1e-3f, b = 1.0001f;
    while (clock64() - start < cycles) {
#pragma unroll
        for (int i = 0; i < 32; ++i) a = fmaf(a, b, 1e-7f);
    }
    if (a == -1.0f) sink[blockIdx.x] = a;
}

__global__ void empty_kernel() {}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static const char *arg(int argc, char **argv, const char *name, const char *fallback) {
    for (int i = 2; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
    return fallback;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static int mode_spin(int argc, char **argv) {
    double seconds = std::atof(arg(argc, argv, "--seconds", "4"));
    long long cycles = std::atoll(arg(argc, argv, "--cycles", "2000000"));
    const char *ready = arg(argc, argv, "--ready", nullptr);
    const char *go = arg(argc, argv, "--go", nullptr);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int threads = 256;
    int blocks = prop.multiProcessorCount * (prop.maxThreadsPerMultiProcessor / threads);
    float *sink = nullptr;
    CHECK(cudaMalloc(&sink, sizeof(float) * blocks));
    // At most `depth` kernels queued: the throttle (if any) then shows up as launch waits
    // rather than as an unbounded queue drained after the timer stops.
    const int depth = 4;
    auto run_for = [&](double secs, long long *kernels) {
        double end = now_s() + secs;
        long long n = 0;
        while (now_s() < end) {
            for (int i = 0; i < depth; ++i) spin_kernel<<<blocks, threads>>>(cycles, sink);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            n += depth;
        }
        *kernels = n;
    };
    long long warm = 0;
    run_for(1.0, &warm);
    if (ready && go) {
        FILE *f = std::fopen(ready, "w");
        if (!f) { std::perror("spin: --ready"); return 1; }
        std::fclose(f);
        double deadline = now_s() + 60.0;
        while (access(go, F_OK) != 0) {
            if (now_s() > deadline) { std::fprintf(stderr, "spin: no --go file in 60 s\n"); return 1; }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    long long kernels = 0;
    double t0 = now_s();
    run_for(seconds, &kernels);
    double elapsed = now_s() - t0;
    CHECK(cudaFree(sink));
    std::printf("RESULT {\"mode\":\"spin\",\"pid\":%d,\"kernels\":%lld,\"seconds\":%.4f,"
                "\"kernels_per_s\":%.3f,\"blocks\":%d,\"threads\":%d,\"cycles\":%lld,"
                "\"sm_count\":%d,\"clock_khz\":%d}\n",
                static_cast<int>(getpid()), kernels, elapsed, kernels / elapsed, blocks, threads,
                cycles, prop.multiProcessorCount, prop.clockRate);
    return 0;
}

static int mode_launch(int argc, char **argv) {
    int count = std::atoi(arg(argc, argv, "--count", "20000"));
    int reps = std::atoi(arg(argc, argv, "--reps", "5"));
    CHECK(cudaFree(nullptr));  // create the context outside the timed region
    empty_kernel<<<1, 1>>>();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
        double t0 = now_s();
        for (int i = 0; i < count; ++i) empty_kernel<<<1, 1>>>();
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        rates.push_back(count / (now_s() - t0));
    }
    std::printf("RESULT {\"mode\":\"launch\",\"pid\":%d,\"count\":%d,\"reps\":%d,"
                "\"launches_per_s\":%.1f,\"min\":%.1f,\"max\":%.1f}\n",
                static_cast<int>(getpid()), count, reps, median(rates),
                *std::min_element(rates.begin(), rates.end()),
                *std::max_element(rates.begin(), rates.end()));
    return 0;
}

static int mode_alloc(int argc, char **argv) {
    int count = std::atoi(arg(argc, argv, "--count", "2000"));
    int reps = std::atoi(arg(argc, argv, "--reps", "5"));
    size_t bytes = std::strtoull(arg(argc, argv, "--bytes", "2097152"), nullptr, 10);
    CHECK(cudaFree(nullptr));
    std::vector<double> rates;
    for (int r = 0; r < reps; ++r) {
        double t0 = now_s();
        for (int i = 0; i < count; ++i) {
            void *p = nullptr;
            CHECK(cudaMalloc(&p, bytes));
            CHECK(cudaFree(p));
        }
        rates.push_back(count / (now_s() - t0));
    }
    std::printf("RESULT {\"mode\":\"alloc\",\"pid\":%d,\"count\":%d,\"reps\":%d,\"bytes\":%zu,"
                "\"pairs_per_s\":%.1f,\"min\":%.1f,\"max\":%.1f}\n",
                static_cast<int>(getpid()), count, reps, bytes, median(rates),
                *std::min_element(rates.begin(), rates.end()),
                *std::max_element(rates.begin(), rates.end()));
    return 0;
}

int main(int argc, char **argv) {
    std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "spin") return mode_spin(argc, argv);
    if (mode == "launch") return mode_launch(argc, argv);
    if (mode == "alloc") return mode_alloc(argc, argv);
    std::fprintf(stderr, "usage: spin spin|launch|alloc [options]\n");
    return 2;
}
