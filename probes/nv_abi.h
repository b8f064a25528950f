/* The NVIDIA driver numbers the probes test by value: RM escapes, RM classes and
 * the UVM initialize commands (docs/driver-facts.md §1.1, §2.2, §2.4). Their Python
 * twins are in gputrace/nvabi.py; tests/unit/record/test_bpf_defines.py checks every one. */
#ifndef GT_NV_ABI_H
#define GT_NV_ABI_H

#define GT_ESC_RM_ALLOC_MEMORY 0x27
#define GT_ESC_RM_FREE 0x29
#define GT_ESC_RM_CONTROL 0x2A
#define GT_ESC_RM_ALLOC 0x2B
#define GT_ESC_RM_DUP_OBJECT 0x34
#define GT_ESC_RM_VID_HEAP_CONTROL 0x4A
#define GT_ESC_RM_MAP_MEMORY 0x4E
#define GT_ESC_RM_UNMAP_MEMORY 0x4F
#define GT_ESC_RM_MAP_MEMORY_DMA 0x57
#define GT_ESC_RM_UNMAP_MEMORY_DMA 0x58
#define GT_ESC_IOCTL_XFER_CMD 211

#define GT_CLASS_NV01_DEVICE_0 0x80
#define GT_CLASS_NV01_MEMORY_SYSTEM 0x3E
#define GT_CLASS_NV01_MEMORY_LOCAL_USER 0x40
#define GT_CLASS_NV01_MEMORY_VIRTUAL 0x70
#define GT_CLASS_NV_MEMORY_FABRIC 0xF8
#define GT_CLASS_NV50_MEMORY_VIRTUAL 0x50A0

#define GT_UVM_INITIALIZE 0x30000001
#define GT_UVM_DEINITIALIZE 0x30000002

#endif
