// TEST STAND-IN: libc10_cuda.so, PyTorch's CUDA caching allocator reduced to a few
// dozen lines. NOT PyTorch code: no line is copied from it. Only the names are PyTorch's:
// the namespaces, class and method signatures below mangle to exactly the symbols the
// real library holds (torch 2.14.1's libc10_cuda.so, listed in docs/driver-facts.md,
// "PyTorch"), and, as there, they are LOCAL symbols of .symtab (the library is built with
// hidden visibility), so the recorder finds them as it finds the real ones.
//
// The allocator: blocks rounded up to 512 bytes (kMinBlockSize), carved first-fit out
// of segments, each one cuMemAlloc_v2 of the stand-in libcuda (tests/standin_cuda):
// requests up to 1 MiB from 2 MiB "small" segments, larger ones from segments of the
// request rounded up to 2 MiB. A freed block stays cached in its segment (never
// coalesced: the tests know the cache block by block). When cuMemAlloc_v2 fails with
// CUDA_ERROR_OUT_OF_MEMORY, malloc frees every segment without a live block and tries
// once more, then throws c10::OutOfMemoryError, as PyTorch does: through any probe
// on the way (the reason the recorder takes malloc's return at its `ret`
// instructions, never with a uretprobe; docs/record.md).
//
// Called from Python through ctypes by the extern "C" functions at the end.
//
// Built three times (Makefile), in the shapes of the releases symbols.py knows and one
// it does not:
//   default       2.14: free(void*) a function of its own;
//   SHAPE_2_5     2.5: free inlined into its callers, the DataPtr deleter
//                 local_raw_delete(void*) (a free function) and raw_delete(void*);
//   SHAPE_2_1     2.1: as 2.5, and malloc takes an int device;
//   SHAPE_UNKNOWN malloc takes one more argument: no table matches, the layer skips it.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

extern "C" {
typedef unsigned long long CUdeviceptr;
int cuInit(unsigned int flags);
int cuDeviceGet(int *device, int ordinal);
int cuCtxCreate_v2(void **pctx, unsigned int flags, int dev);
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
int cuMemFree_v2(CUdeviceptr dptr);
}
struct CUstream_st;  // opaque, as in cuda.h

namespace c10 {
class OutOfMemoryError : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};
namespace cuda {
namespace CUDACachingAllocator {
namespace Native {

constexpr size_t kMinBlock = 512;
constexpr size_t kSmallSize = 1 << 20;
constexpr size_t kSmallSegment = 2 << 20;

struct Block {
    CUdeviceptr ptr;
    size_t size;
    bool live;
};
struct Segment {
    CUdeviceptr base;
    size_t size;
    signed char device;
    CUstream_st *stream;
    std::vector<Block> blocks;  // address order; live or cached
};

#ifdef SHAPE_2_1
using DeviceArg = int;
#define SHAPE_2_5
#else
using DeviceArg = signed char;
#endif
#ifdef SHAPE_UNKNOWN
#define MORE , bool more = false
#define MORE_DEF , bool
#else
#define MORE
#define MORE_DEF
#endif
#ifdef SHAPE_2_5
#define FREE_INLINE __attribute__((always_inline)) inline
#else
#define FREE_INLINE __attribute__((noinline))
#endif

class NativeCachingAllocator {
  public:
    __attribute__((noinline)) void malloc(void **devPtr, DeviceArg device, unsigned long size,
                                          CUstream_st *stream MORE);
    FREE_INLINE void free(void *ptr);
    __attribute__((noinline)) void raw_delete(void *ptr);
    __attribute__((noinline)) void emptyCache(std::pair<unsigned long long, unsigned long long> pool);
    std::vector<Segment> segments;

  private:
    bool carve(Segment &s, size_t size, CUdeviceptr *out);
    void release_cached();
};

bool NativeCachingAllocator::carve(Segment &s, size_t size, CUdeviceptr *out)
{
    CUdeviceptr end = s.base;
    for (auto &b : s.blocks) {  // a cached block of the same size first
        if (!b.live && b.size == size) {
            b.live = true;
            *out = b.ptr;
            return true;
        }
        end = b.ptr + b.size;
    }
    if (s.base + s.size - end < size)
        return false;
    s.blocks.push_back(Block{end, size, true});
    *out = end;
    return true;
}

void NativeCachingAllocator::release_cached()
{
    std::vector<Segment> keep;
    for (auto &s : segments) {
        bool used = false;
        for (auto &b : s.blocks)
            used |= b.live;
        if (used)
            keep.push_back(s);
        else
            cuMemFree_v2(s.base);
    }
    segments.swap(keep);
}

void NativeCachingAllocator::malloc(void **devPtr, DeviceArg device, unsigned long size,
                                    CUstream_st *stream MORE_DEF)
{
    size_t rounded = size < kMinBlock ? kMinBlock : (size + kMinBlock - 1) / kMinBlock * kMinBlock;
    CUdeviceptr p = 0;
    for (auto &s : segments) {
        bool small = s.size == kSmallSegment;
        if (s.device == device && s.stream == stream && small == (rounded <= kSmallSize) &&
            carve(s, rounded, &p)) {
            *devPtr = reinterpret_cast<void *>(p);
            return;
        }
    }
    size_t seg = rounded <= kSmallSize ? kSmallSegment
                                       : (rounded + kSmallSegment - 1) / kSmallSegment * kSmallSegment;
    CUdeviceptr base = 0;
    int r = cuMemAlloc_v2(&base, seg);
    if (r == 2) {  // CUDA_ERROR_OUT_OF_MEMORY: free the cache, try once more
        release_cached();
        r = cuMemAlloc_v2(&base, seg);
    }
    if (r != 0)
        throw c10::OutOfMemoryError("CUDA out of memory (stand-in)");
    segments.push_back(Segment{base, seg, static_cast<signed char>(device), stream, {}});
    carve(segments.back(), rounded, &p);
    *devPtr = reinterpret_cast<void *>(p);
}

FREE_INLINE void NativeCachingAllocator::free(void *ptr)
{
    auto p = reinterpret_cast<CUdeviceptr>(ptr);
    for (auto &s : segments)
        for (auto &b : s.blocks)
            if (b.live && b.ptr == p) {
                b.live = false;
                return;
            }
}

void NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long>)
{
    release_cached();
}

void NativeCachingAllocator::raw_delete(void *ptr)
{
    this->free(ptr);
}

NativeCachingAllocator allocator;

// The deleter of every tensor's DataPtr.
__attribute__((noinline)) void local_raw_delete(void *ptr)
{
    allocator.free(ptr);
}

}  // namespace Native
}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10

using c10::cuda::CUDACachingAllocator::Native::allocator;
using c10::cuda::CUDACachingAllocator::Native::local_raw_delete;

extern "C" {
#define EXPORT __attribute__((visibility("default"), noinline))

// A tensor of `size` bytes on `device` and `stream`: its pointer, or 0 when the
// allocator threw OutOfMemoryError (caught here, as PyTorch turns it into Python's).
EXPORT unsigned long long standin_torch_malloc(unsigned long size, int device,
                                                unsigned long long stream)
{
    static bool inited = [] {  // the context the CUDA runtime would make
        int dev = 0;
        void *ctx = nullptr;
        return cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0 && cuCtxCreate_v2(&ctx, 0, dev) == 0;
    }();
    if (!inited)
        return 0;
    void *p = nullptr;
    try {
        allocator.malloc(&p, static_cast<c10::cuda::CUDACachingAllocator::Native::DeviceArg>(device),
                         size,
                         reinterpret_cast<CUstream_st *>(stream));
    } catch (const c10::OutOfMemoryError &) {
        return 0;
    }
    return reinterpret_cast<unsigned long long>(p);
}

EXPORT void standin_torch_free(unsigned long long ptr)
{
    local_raw_delete(reinterpret_cast<void *>(ptr));
}

EXPORT void standin_torch_empty_cache(void)
{
    allocator.emptyCache({0, 0});
}

// Bytes reserved (segments) and allocated (live blocks, rounded): the truth the tests
// compare a recording's allocator tables with.
EXPORT unsigned long long standin_torch_reserved(void)
{
    unsigned long long n = 0;
    for (auto &s : allocator.segments)
        n += s.size;
    return n;
}

EXPORT unsigned long long standin_torch_allocated(void)
{
    unsigned long long n = 0;
    for (auto &s : allocator.segments)
        for (auto &b : s.blocks)
            n += b.live ? b.size : 0;
    return n;
}
}
