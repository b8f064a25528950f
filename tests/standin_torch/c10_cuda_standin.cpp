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
// A free of a tensor another stream used (standin_torch_record_stream, PyTorch's
// recordStream) is deferred as PyTorch defers it: DeviceCachingAllocator::free ->
// insert_events(Block*), the block back in the cache at the next malloc's
// process_events -> free_block(Block*, ...); an ordinary free calls free_block at once.
//
// Expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, read once at
// the first malloc as PyTorch reads its allocator config): per device, stream and pool
// one reserved VA range (cuMemAddressReserve) whose pages (2 MiB small, 20 MiB large,
// PyTorch's segment sizes) are mapped as malloc needs them, each a cuMemCreate then a
// cuMemMap (then cuMemSetAccess), and unmapped from the end (cuMemUnmap, cuMemRelease)
// when the cache is emptied or a mapping failed out of memory.
//
// The async backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync):
// CudaMallocAsync::(anonymous namespace)::mallocAsync/freeAsync over cuMemAllocAsync and
// cuMemFreeAsync, with PyTorch's deferral: a tensor made outside a CUDA graph capture
// and freed during one is given back (cuMemFreeAsync) at the next mallocAsync after the
// capture (standin_torch_capture starts and ends one).
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
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#define _Static_assert static_assert  // the header is C11's
#include "cuda_standin.h"  // tests/standin_cuda: cuda.h's types (CUstream_st, ...)

namespace c10 {
struct GatheredContext {  // the stack a snapshot keeps (opaque here)
    virtual ~GatheredContext() = default;
};
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
constexpr size_t kLargePage = 20 << 20;  // an expandable large segment's page
constexpr size_t kReserve = 1ull << 30;   // an expandable segment's VA range

struct Slot {  // a carved range of a segment: a tensor's (live) or cached
    CUdeviceptr ptr;
    size_t size;
    bool live;
};
struct Segment {
    CUdeviceptr base;
    size_t size;  // an expandable segment's: the bytes mapped from its base
    signed char device;
    CUstream_st *stream;
    std::vector<Slot> blocks;  // address order; live or cached
    size_t page = 0;            // expandable: its page size; 0: one cuMemAlloc_v2
    bool small = false;
    std::vector<CUmemGenericAllocationHandle> handles{};  // expandable: one per page
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

// A tensor's block as the allocator hands it out (PyTorch's Block, in an anonymous
// namespace as there): the streams that used it besides its own (recordStream).
namespace {
struct Block {
    CUdeviceptr ptr;
    size_t size;
    std::vector<CUstream_st *> stream_uses;
};
const std::shared_ptr<GatheredContext> no_context;
}  // namespace

void release_slot(CUdeviceptr p);

// PyTorch's per-device allocator: a free whose block another stream used waits for
// events on those streams (insert_events) and the block goes back to the cache when
// they have completed (process_events, at the next malloc here: the stand-in has no
// work on its streams), through free_block, as an immediate free does. noipa: the
// methods taking the anonymous namespace's Block keep their names (no .isra clone).
class DeviceCachingAllocator {
  public:
    __attribute__((noipa)) void free(Block *block);
    __attribute__((noipa)) void insert_events(Block *block);
    __attribute__((noipa)) void free_block(Block *block,
                                           const std::shared_ptr<GatheredContext> &context);
    __attribute__((noipa)) void process_events(const std::shared_ptr<GatheredContext> &context);
    std::vector<Block *> outstanding;  // freed, waiting for their streams' events
};

void DeviceCachingAllocator::free(Block *block)
{
    if (!block->stream_uses.empty())
        insert_events(block);
    else
        free_block(block, no_context);
}

void DeviceCachingAllocator::insert_events(Block *block)
{
    outstanding.push_back(block);
}

void DeviceCachingAllocator::free_block(Block *block, const std::shared_ptr<GatheredContext> &)
{
    release_slot(block->ptr);
    delete block;
}

void DeviceCachingAllocator::process_events(const std::shared_ptr<GatheredContext> &context)
{
    std::vector<Block *> done;
    done.swap(outstanding);
    for (Block *b : done)
        free_block(b, context);
}

class NativeCachingAllocator {
  public:
    __attribute__((noinline)) void malloc(void **devPtr, DeviceArg device, unsigned long size,
                                          CUstream_st *stream MORE);
    FREE_INLINE void free(void *ptr);
    __attribute__((noinline)) void raw_delete(void *ptr);
    __attribute__((noinline)) void emptyCache(std::pair<unsigned long long, unsigned long long> pool);
    std::vector<Segment> segments;
    DeviceCachingAllocator device_allocator;
    std::unordered_map<CUdeviceptr, Block *> allocated_blocks;

    unsigned long long pages_mapped = 0, pages_unmapped = 0;

  private:
    bool carve(Segment &s, size_t size, CUdeviceptr *out);
    void release_cached();
    int map_pages(Segment &s, size_t size);
    void unmap_free_tail(Segment &s);
    void track(void *ptr, size_t size)
    {
        auto p = reinterpret_cast<CUdeviceptr>(ptr);
        allocated_blocks[p] = new Block{p, size, {}};
    }
    bool expandable_malloc(void **devPtr, signed char device, size_t rounded, CUstream_st *stream);
};

static bool conf_has(const char *what)  // PYTORCH_CUDA_ALLOC_CONF, read as PyTorch does
{
    const char *c = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    return c && std::strstr(c, what);
}

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
    s.blocks.push_back(Slot{end, size, true});
    *out = end;
    return true;
}

// Map pages at the end of `s` until `size` more bytes past its last block fit.
int NativeCachingAllocator::map_pages(Segment &s, size_t size)
{
    CUdeviceptr end = s.blocks.empty() ? s.base : s.blocks.back().ptr + s.blocks.back().size;
    while (end + size > s.base + s.size) {
        if (s.size + s.page > kReserve)
            return 2;
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = s.device;
        CUmemGenericAllocationHandle h = 0;
        int r = cuMemCreate(&h, s.page, &prop, 0);
        if (r != 0)
            return r;
        r = cuMemMap(s.base + s.size, s.page, 0, h, 0);
        if (r != 0) {
            cuMemRelease(h);
            return r;
        }
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        cuMemSetAccess(s.base + s.size, s.page, &access, 1);
        s.handles.push_back(h);
        s.size += s.page;
        pages_mapped++;
    }
    return 0;
}

// Unmap the pages past an expandable segment's last live block (its cached blocks
// there go with them).
void NativeCachingAllocator::unmap_free_tail(Segment &s)
{
    while (!s.blocks.empty() && !s.blocks.back().live)
        s.blocks.pop_back();
    CUdeviceptr end = s.blocks.empty() ? s.base : s.blocks.back().ptr + s.blocks.back().size;
    while (s.size > 0 && s.base + s.size - s.page >= end) {
        s.size -= s.page;
        cuMemUnmap(s.base + s.size, s.page);
        cuMemRelease(s.handles.back());
        s.handles.pop_back();
        pages_unmapped++;
    }
}

bool NativeCachingAllocator::expandable_malloc(void **devPtr, signed char device, size_t rounded,
                                               CUstream_st *stream)
{
    bool small = rounded <= kSmallSize;
    Segment *seg = nullptr;
    for (auto &s : segments)
        if (s.page && s.device == device && s.stream == stream && s.small == small)
            seg = &s;
    if (!seg) {
        CUdeviceptr base = 0;
        if (cuMemAddressReserve(&base, kReserve, 0, 0, 0) != 0)
            throw c10::OutOfMemoryError("CUDA out of memory (stand-in: no VA)");
        segments.push_back(Segment{base, 0, device, stream, {}, small ? kSmallSegment : kLargePage,
                                   small});
        seg = &segments.back();
    }
    CUdeviceptr p = 0;
    if (carve(*seg, rounded, &p)) {
        *devPtr = reinterpret_cast<void *>(p);
        return true;
    }
    int r = map_pages(*seg, rounded);
    if (r == 2) {  // out of memory: give back the cache, try once more
        release_cached();
        r = map_pages(*seg, rounded);
    }
    if (r != 0)
        throw c10::OutOfMemoryError("CUDA out of memory (stand-in)");
    carve(*seg, rounded, &p);
    *devPtr = reinterpret_cast<void *>(p);
    return true;
}

void NativeCachingAllocator::release_cached()
{
    std::vector<Segment> keep;
    for (auto &s : segments) {
        if (s.page) {  // expandable: its reservation stays, its free tail goes
            unmap_free_tail(s);
            keep.push_back(s);
            continue;
        }
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
    device_allocator.process_events(no_context);
    static const bool expandable = conf_has("expandable_segments:True");
    void *got = nullptr;  // each tensor is tracked before *devPtr is written: malloc ends
                          // in a store and a `ret`, never a tail call (symbols.py refuses it)
    if (expandable && expandable_malloc(&got, static_cast<signed char>(device), rounded, stream)) {
        track(got, rounded);
        *devPtr = got;
        return;
    }
    CUdeviceptr p = 0;
    for (auto &s : segments) {
        bool small = s.size == kSmallSegment;
        if (!s.page && s.device == device && s.stream == stream && small == (rounded <= kSmallSize) &&
            carve(s, rounded, &p)) {
            track(reinterpret_cast<void *>(p), rounded);
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
    track(reinterpret_cast<void *>(p), rounded);
    *devPtr = reinterpret_cast<void *>(p);
}

FREE_INLINE void NativeCachingAllocator::free(void *ptr)
{
    auto it = allocated_blocks.find(reinterpret_cast<CUdeviceptr>(ptr));
    if (it == allocated_blocks.end())
        return;
    Block *block = it->second;
    allocated_blocks.erase(it);
    device_allocator.free(block);
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

// A block's range back in its segment's cache.
void release_slot(CUdeviceptr p)
{
    for (auto &s : allocator.segments)
        for (auto &b : s.blocks)
            if (b.live && b.ptr == p) {
                b.live = false;
                return;
            }
}

// The deleter of every tensor's DataPtr.
__attribute__((noinline)) void local_raw_delete(void *ptr)
{
    allocator.free(ptr);
}

}  // namespace Native

// The cudaMallocAsync backend: each tensor one cuMemAllocAsync, given back by a
// cuMemFreeAsync at its free, or deferred past a CUDA graph capture.
namespace CudaMallocAsync {
namespace {

struct PtrUsage {
    size_t size;
    bool captured;
    CUstream_st *stream;
};
std::unordered_map<void *, PtrUsage> ptr_info;
std::vector<void *> ungraphed_ptrs_defer_free_until_no_capture;
bool capture_underway = false;

// noipa: the static functions keep their names and signatures (no .isra clone), as
// the real library's do
__attribute__((noipa)) void free_impl(void *ptr)
{
    auto it = ptr_info.find(ptr);
    cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(ptr), it->second.stream);
    ptr_info.erase(it);
}

__attribute__((noipa)) void freeAsync(void *ptr)
{
    auto it = ptr_info.find(ptr);
    if (it == ptr_info.end())
        return;
    if (capture_underway && !it->second.captured) {
        ungraphed_ptrs_defer_free_until_no_capture.push_back(ptr);
        return;
    }
    free_impl(ptr);
}

__attribute__((noipa)) void mallocAsync(void **devPtr, Native::DeviceArg device, size_t size,
                                        CUstream_st *stream)
{
    (void)device;
    if (!capture_underway && !ungraphed_ptrs_defer_free_until_no_capture.empty()) {
        for (void *p : ungraphed_ptrs_defer_free_until_no_capture)
            free_impl(p);
        ungraphed_ptrs_defer_free_until_no_capture.clear();
    }
    CUdeviceptr p = 0;
    int r = cuMemAllocAsync(&p, size, stream);
    if (r == 2)
        throw c10::OutOfMemoryError("CUDA out of memory (stand-in, cudaMallocAsync)");
    if (r != 0)
        throw std::runtime_error("cuMemAllocAsync failed");
    ptr_info[reinterpret_cast<void *>(p)] = PtrUsage{size, capture_underway, stream};
    *devPtr = reinterpret_cast<void *>(p);
}

}  // namespace

// The deleter of every tensor's DataPtr with this backend.
__attribute__((noinline)) void local_raw_delete(void *ptr)
{
    freeAsync(ptr);
}

}  // namespace CudaMallocAsync
}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10

using c10::cuda::CUDACachingAllocator::Native::allocator;
using c10::cuda::CUDACachingAllocator::Native::local_raw_delete;
namespace async_backend = c10::cuda::CUDACachingAllocator::CudaMallocAsync;

static bool use_async()
{
    static const bool on = c10::cuda::CUDACachingAllocator::Native::conf_has(
        "backend:cudaMallocAsync");
    return on;
}

// The async backend's bytes: alive (not freed) and pending (freed, deferred).
static unsigned long long async_bytes(bool pending)
{
    unsigned long long n = 0;
    for (auto &[ptr, u] : async_backend::ptr_info) {
        bool deferred = false;
        for (void *d : async_backend::ungraphed_ptrs_defer_free_until_no_capture)
            deferred |= d == ptr;
        n += deferred == pending ? u.size : 0;
    }
    return n;
}

extern "C" {
#define EXPORT __attribute__((visibility("default"), noinline))

// A tensor of `size` bytes on `device` and `stream`: its pointer, or 0 when the
// allocator threw OutOfMemoryError (caught here, as PyTorch turns it into Python's).
EXPORT unsigned long long standin_torch_malloc(unsigned long size, int device,
                                                unsigned long long stream)
{
    static bool inited = [] {  // the context the CUDA runtime would make
        int dev = 0;
        CUcontext ctx = nullptr;
        return cuInit(0) == 0 && cuDeviceGet(&dev, 0) == 0 && cuCtxCreate_v2(&ctx, 0, dev) == 0;
    }();
    if (!inited)
        return 0;
    void *p = nullptr;
    auto dev = static_cast<c10::cuda::CUDACachingAllocator::Native::DeviceArg>(device);
    try {
        if (use_async())
            async_backend::mallocAsync(&p, dev, size, reinterpret_cast<CUstream_st *>(stream));
        else
            allocator.malloc(&p, dev, size, reinterpret_cast<CUstream_st *>(stream));
    } catch (const c10::OutOfMemoryError &) {
        return 0;
    }
    return reinterpret_cast<unsigned long long>(p);
}

EXPORT void standin_torch_free(unsigned long long ptr)
{
    if (use_async())
        async_backend::local_raw_delete(reinterpret_cast<void *>(ptr));
    else
        local_raw_delete(reinterpret_cast<void *>(ptr));
}

// recordStream: the tensor at `ptr` is used by `stream` too; its free then waits.
EXPORT void standin_torch_record_stream(unsigned long long ptr, unsigned long long stream)
{
    auto it = allocator.allocated_blocks.find(ptr);
    if (it != allocator.allocated_blocks.end())
        it->second->stream_uses.push_back(reinterpret_cast<CUstream_st *>(stream));
}

// Bytes of blocks freed and still waiting for another stream (active, not allocated).
EXPORT unsigned long long standin_torch_pending(void)
{
    unsigned long long n = 0;
    for (auto *b : allocator.device_allocator.outstanding)
        n += b->size;
    return n;
}

// A CUDA graph capture begins (1) or ends (0): the async backend defers the frees of
// tensors made outside it (beginAllocateStreamToPool / endAllocateStreamToPool).
EXPORT void standin_torch_capture(int on)
{
    async_backend::capture_underway = on != 0;
}

// Pages of expandable segments mapped (0) and unmapped (1) so far.
EXPORT unsigned long long standin_torch_pages(int unmapped)
{
    return unmapped ? allocator.pages_unmapped : allocator.pages_mapped;
}

EXPORT void standin_torch_empty_cache(void)
{
    allocator.emptyCache({0, 0});
}

// Bytes reserved (segments) and allocated (live blocks, rounded): the truth the tests
// compare a recording's allocator tables with.
EXPORT unsigned long long standin_torch_reserved(void)
{
    if (use_async())
        return async_bytes(false) + async_bytes(true);
    unsigned long long n = 0;
    for (auto &s : allocator.segments)
        n += s.size;
    return n;
}

EXPORT unsigned long long standin_torch_allocated(void)
{
    if (use_async())
        return async_bytes(false);
    unsigned long long n = 0;
    for (auto &s : allocator.segments)
        for (auto &b : s.blocks)
            n += b.live ? b.size : 0;
    return n - standin_torch_pending();
}
}
