/* RM escapes on nvidiactl / nvidiaN (docs/driver-facts.md §2.2-2.4): the
 * parameter size comes from the request number (_IOC_SIZE), so historic
 * layouts are told apart by size; XFER is unwrapped. Included by nv_ioctl.bpf.h. */
#include "common.bpf.h"
#include "nv_abi.h"

#ifndef GT_NVOS21_STATUS_OFF
#define GT_NVOS21_STATUS_OFF 28 /* 24 before 535.43.02 */
#endif
#ifndef GT_NVOS64_40_STATUS_OFF
#define GT_NVOS64_40_STATUS_OFF 36 /* 40-byte NVOS64: 32 up to 520, 36 in 525-530 */
#endif

/* Class-specific allocation parameters behind pAllocParms (§2.4). */
static __always_inline void rm_alloc_params(struct ioctl_event *e, u32 cls, u64 ap)
{
    u32 w[22]; /* not cleared: every field is read after a read covering it */
    if (!ap)
        return;
    if (cls == GT_CLASS_NV01_MEMORY_SYSTEM || cls == GT_CLASS_NV01_MEMORY_LOCAL_USER ||
        cls == GT_CLASS_NV50_MEMORY_VIRTUAL) { /* NV_MEMORY_ALLOCATION_PARAMS */
        if (bpf_probe_read_user(w, 88, (void *)ap))
            return;
        SET(flags, GT_V_FLAGS, W32(8));
        SET(attr, GT_V_ATTR, W32(24));
        SET(attr2, GT_V_ATTR2, W32(28));
        SET(size_bytes, GT_V_SIZE, W64(64));
        SET(alignment, GT_V_ALIGNMENT, W64(72));
        SET(offset, GT_V_OFFSET, W64(80));
    } else if (cls == GT_CLASS_NV01_MEMORY_VIRTUAL) { /* NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS {offset, limit} */
        if (bpf_probe_read_user(w, 16, (void *)ap))
            return;
        SET(offset, GT_V_OFFSET, W64(0));
        if (W64(8) >= W64(0) && W64(8) != 0)
            SET(size_bytes, GT_V_SIZE, W64(8) - W64(0) + 1);
    } else if (cls == GT_CLASS_NV01_DEVICE_0) { /* NV0080_ALLOCATION_PARAMETERS: deviceId @0 (cl0080.h) */
        if (bpf_probe_read_user(w, 4, (void *)ap))
            return;
        if (W32(0) < 0x8000) /* the RM device instance: which GPU the subtree is on */
            e->gpu_index = (s16)W32(0);
    } else if (cls == GT_CLASS_NV_MEMORY_FABRIC) { /* NV00F8_ALLOCATION_PARAMETERS */
        if (bpf_probe_read_user(w, 28, (void *)ap))
            return;
        SET(alignment, GT_V_ALIGNMENT, W64(0));
        SET(size_bytes, GT_V_SIZE, W64(8));
        SET(flags, GT_V_FLAGS, W32(24));
    }
}

static __always_inline void rm_decode(struct ioctl_event *e, u32 cmd, u64 arg)
{
    u32 nr = cmd & 0xff, size = (cmd >> 16) & 0x3fff;
    u64 p = arg;
    u32 w[32]; /* not cleared: every W32/W64 follows an RD() covering it */
    if (nr == GT_ESC_IOCTL_XFER_CMD) { /* NV_ESC_IOCTL_XFER_CMD {cmd, size, ptr} */
        if (size < 16 || bpf_probe_read_user(w, 16, (void *)arg))
            return;
        nr = W32(0);
        size = W32(4);
        p = W64(8);
    }
    e->nr = nr;
    if (nr == GT_ESC_RM_ALLOC) { /* RM_ALLOC: NVOS21 (32) or NVOS64 (48; 40 before 535) */
        if (size == 48 && RD(48))
            SET(status, GT_V_STATUS, W32(40));
        else if (size == 40 && RD(40))
            SET(status, GT_V_STATUS, W32(GT_NVOS64_40_STATUS_OFF));
        else if (size == 32 && RD(32))
            SET(status, GT_V_STATUS, W32(GT_NVOS21_STATUS_OFF));
        else
            return;
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(h_class, GT_V_H_CLASS, W32(12));
        rm_alloc_params(e, W32(12), W64(16));
    } else if (nr == GT_ESC_RM_FREE && RD(16)) { /* RM_FREE: NVOS00 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(status, GT_V_STATUS, W32(12));
    } else if (nr == GT_ESC_RM_CONTROL && RD(32)) { /* RM_CONTROL: NVOS54 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_object, GT_V_H_OBJECT, W32(4));
        SET(ctrl_cmd, GT_V_CTRL_CMD, W32(8));
        SET(flags, GT_V_FLAGS, W32(12));
        SET(status, GT_V_STATUS, W32(28));
    } else if (nr == GT_ESC_RM_DUP_OBJECT && RD(28)) { /* RM_DUP_OBJECT: NVOS55 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(flags, GT_V_FLAGS, W32(20));
        SET(status, GT_V_STATUS, W32(24));
    } else if (nr == GT_ESC_RM_VID_HEAP_CONTROL && RD(128)) { /* RM_VID_HEAP_CONTROL: NVOS32 */
        u32 fn = W32(8);
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(ctrl_cmd, GT_V_CTRL_CMD, fn); /* NVOS32 function: 2 alloc, 3 free */
        SET(status, GT_V_STATUS, W32(20));
        SET(h_object, GT_V_H_OBJECT, W32(44));
        if (fn == 2) {
            SET(flags, GT_V_FLAGS, W32(52));
            SET(attr, GT_V_ATTR, W32(56));
            SET(size_bytes, GT_V_SIZE, W64(88));
            SET(alignment, GT_V_ALIGNMENT, W64(96));
            SET(offset, GT_V_OFFSET, W64(104));
            SET(va_base, GT_V_VA_BASE, W64(120));
        } else if (fn == 3) {
            SET(flags, GT_V_FLAGS, W32(48));
        }
    } else if (nr == GT_ESC_RM_MAP_MEMORY && RD(48)) { /* RM_MAP_MEMORY: NVOS33 (+ fd) */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(offset, GT_V_OFFSET, W64(16));
        SET(size_bytes, GT_V_SIZE, W64(24));
        SET(va_base, GT_V_VA_BASE, W64(32));
        SET(status, GT_V_STATUS, W32(40));
        SET(flags, GT_V_FLAGS, W32(44));
        if (RD(56))
            SET(ref_fd, GT_V_REF_FD, (s32)W32(48));
    } else if (nr == GT_ESC_RM_UNMAP_MEMORY && RD(32)) { /* RM_UNMAP_MEMORY: NVOS34 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(va_base, GT_V_VA_BASE, W64(16));
        SET(status, GT_V_STATUS, W32(24));
        SET(flags, GT_V_FLAGS, W32(28));
    } else if (nr == GT_ESC_RM_MAP_MEMORY_DMA && RD(56)) { /* RM_MAP_MEMORY_DMA: NVOS46, 64 from 580 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(12));
        SET(offset, GT_V_OFFSET, W64(16));
        SET(size_bytes, GT_V_SIZE, W64(24));
        SET(flags, GT_V_FLAGS, W32(32));
        if (size >= 64 && RD(64)) {
            SET(va_base, GT_V_VA_BASE, W64(48));
            SET(status, GT_V_STATUS, W32(56));
        } else {
            SET(va_base, GT_V_VA_BASE, W64(40));
            SET(status, GT_V_STATUS, W32(48));
        }
    } else if (nr == GT_ESC_RM_UNMAP_MEMORY_DMA && RD(40)) { /* RM_UNMAP_MEMORY_DMA: NVOS47, 48 from 550 */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(12));
        SET(flags, GT_V_FLAGS, W32(16));
        SET(va_base, GT_V_VA_BASE, W64(24));
        if (size >= 48 && RD(48)) {
            SET(size_bytes, GT_V_SIZE, W64(32));
            SET(status, GT_V_STATUS, W32(40));
        } else {
            SET(status, GT_V_STATUS, W32(32));
        }
    } else if (nr == GT_ESC_RM_ALLOC_MEMORY && RD(48)) { /* RM_ALLOC_MEMORY: NVOS02 (+ fd) */
        SET(h_client, GT_V_H_CLIENT, W32(0));
        SET(h_parent, GT_V_H_PARENT, W32(4));
        SET(h_object, GT_V_H_OBJECT, W32(8));
        SET(h_class, GT_V_H_CLASS, W32(12));
        SET(flags, GT_V_FLAGS, W32(16));
        SET(va_base, GT_V_VA_BASE, W64(24));
        SET(size_bytes, GT_V_SIZE, W64(32) + 1); /* limit = size - 1 */
        SET(status, GT_V_STATUS, W32(40));
        if (RD(56))
            SET(ref_fd, GT_V_REF_FD, (s32)W32(48));
    }
}

