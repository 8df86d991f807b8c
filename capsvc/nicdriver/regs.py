"""82599 register offsets and bits used by the driver and implemented by the model.

Theory of operation
-------------------
Plain integer constants (byte offsets into BAR0, bit masks) and small functions for the
per-queue register arrays. Values are facts from Intel's ``ixgbe_type.h`` and the 82599
datasheet as collected in spec nicdriver.md (sections 1.4, 1.5, 1.8 and 2.3); datasheet
section numbers are given in brackets where the spec gives them. Nothing here does I/O.

Per-queue arrays have several ranges in ``ixgbe_type.h`` (queues 0..63 at one base, 64..127
at another). The driver supports queues 0..63 and the model queues 0..15, so only the
ranges those need are implemented; a larger index raises ``ValueError``.

The statistics registers are clear-on-read on hardware (spec 1.8). :data:`COUNTERS` lists
every counter the model maintains, with a slot number in the model's control file where the
model publishes a monotonic 64-bit total (spec 2.1 seam 2, implemented by
:class:`capsvc.nicdriver.mmio.ModelBar`).
"""

from __future__ import annotations


def _check(i: int, limit: int) -> int:
    if not 0 <= i < limit:
        raise ValueError(f"register index {i} out of range 0..{limit - 1}")
    return i


# --------------------------------------------------------------------- device identity
INTEL_VENDOR = 0x8086
VIRTIO_VENDOR = 0x1AF4
NETWORK_CLASS = 0x02  # PCI base class "network controller" (config byte 0x0B)

# The boards the driver opens: 82599 physical functions whose port is an SFP+ cage
# ("fiber" media in Intel's ixgbe_82599.c device table). Only for these is the link setup of
# spec 1.4 step 6 right: AUTOC.LMS = 10G serial (no autonegotiation) relies on the board's
# NVM having loaded AUTOC2's serial PMA/PMD = SFI, which is what SFP+ boards do; AUTOC's
# 10G_PMA_PMD field (bits 8:7, XAUI) selects the *parallel* PMA and is unused in serial
# mode. pci.py's allow-list check reads this table. The model presents 0x10FB.
IXGBE_DEVICE_IDS: dict[int, str] = {
    0x10FB: "82599 SFP+ (X520)",
    0x1529: "82599 SFP+ FCoE",
    0x1507: "82599 SFP+ EM",
    0x154D: "82599 SFP+ SF2",
    0x154A: "82599 SFP+ SF QP (quad port)",
    0x1557: "82599EN SFP+",
}
# ixgbe physical functions the driver knows but refuses: their PHY or backplane needs link
# setup this driver does not do (forcing 10G serial on them is wrong). Name -> reason.
IXGBE_UNSUPPORTED_IDS: dict[int, str] = {
    0x10F7: "82599 KX4 (backplane)",
    0x1514: "82599 KX4 mezzanine (backplane)",
    0x1517: "82599 KR (backplane)",
    0x10F8: "82599 combo backplane",
    0x152A: "82599 backplane FCoE",
    0x10FC: "82599 XAUI LOM (backplane)",
    0x10F9: "82599 CX4 (copper, parallel XAUI)",
    0x151C: "82599 T3 LOM (10GBASE-T copper PHY)",
    0x154F: "82599 LS (fixed fiber, LCO)",
    0x1558: "82599 QSFP+ SF QP",
    0x1528: "X540-T (10GBASE-T, different MAC)",
    0x1560: "X540-T1 (10GBASE-T, different MAC)",
}
# VFs are excluded: they have a different register map.
IXGBE_VF_IDS = frozenset({0x10ED, 0x152E, 0x1515, 0x1530})

# PCI config space (spec 1.1)
PCI_VENDOR_ID = 0x00
PCI_DEVICE_ID = 0x02
PCI_COMMAND = 0x04
PCI_COMMAND_MEMORY = 1 << 1  # Memory Space Enable
PCI_COMMAND_MASTER = 1 << 2  # Bus Master Enable
PCI_CLASS_REVISION = 0x08  # u32: class code in bits 31:8, base class in 31:24

BAR0_SIZE = 0x80000  # 512 KiB on the 82599 (spec 2.2)

# ------------------------------------------------------------------ general registers
CTRL = 0x00000
CTRL_GIO_MASTER_DISABLE = 1 << 2  # block new PCIe master requests (datasheet 5.2.5.3.2)
CTRL_LNK_RST = 1 << 3
CTRL_RST = 1 << 26
CTRL_RST_MASK = CTRL_LNK_RST | CTRL_RST

STATUS = 0x00008
STATUS_GIO_MASTER_ENABLE = 1 << 19  # reads 0 once no master request is pending
CTRL_EXT = 0x00018
CTRL_EXT_NS_DIS = 1 << 16  # no-snoop disable (spec 1.4 step 8)

EICR = 0x00800
EICS = 0x00808
EIMS = 0x00880
EIMC = 0x00888
EIAC = 0x00810
GPIE = 0x00898
EITR0 = 0x00820

EEC = 0x10010
EEC_PRES = 1 << 8
EEC_ARD = 1 << 9  # EEPROM auto-read done (spec 1.4 step 4)

RDRXCTL = 0x02F00
RDRXCTL_CRCSTRIP = 1 << 1
RDRXCTL_DMAIDONE = 1 << 3  # DMA init done (spec 1.4 step 5)

AUTOC = 0x042A0
AUTOC_LMS_MASK = 0x7 << 13
AUTOC_LMS_10G_SERIAL = 0x3 << 13
AUTOC_10G_PMA_PMD_MASK = 0x3 << 7
AUTOC_10G_XAUI = 0x0 << 7
AUTOC_AN_RESTART = 1 << 12

LINKS = 0x042A4
LINKS_UP = 1 << 30
LINKS_KX_AN_COMP = 1 << 31
LINKS_SPEED_MASK = 0x3 << 28
LINKS_SPEED_10G = 0x3 << 28
LINKS_SPEED_1G = 0x2 << 28
LINKS_SPEED_100M = 0x1 << 28
LINK_SPEEDS_MBIT = {LINKS_SPEED_100M: 100, LINKS_SPEED_1G: 1000, LINKS_SPEED_10G: 10000}

HLREG0 = 0x04240
HLREG0_TXCRCEN = 1 << 0
HLREG0_RXCRCSTRP = 1 << 1
HLREG0_JUMBOEN = 1 << 2
HLREG0_TXPADEN = 1 << 10

MAXFRS = 0x04268  # max frame size in bits 31:16, FCS included
MAXFRS_DEFAULT = 1518 << 16

FCTRL = 0x05080
FCTRL_MPE = 1 << 8  # multicast promiscuous
FCTRL_UPE = 1 << 9  # unicast promiscuous
FCTRL_BAM = 1 << 10  # accept broadcast

RXCTRL = 0x03000
RXCTRL_RXEN = 1 << 0

DMATXCTL = 0x04A80
DMATXCTL_TE = 1 << 0
DTXMXSZRQ = 0x08100
DTXMXSZRQ_MAX_BYTES_MASK = 0xFFF  # Max_byte_num_req, bits 11:0 (bits 31:12 reserved)
RTTDCS = 0x04900
RTTDCS_ARBDIS = 1 << 6

# Security (MACsec/IPsec) RX path: RXCTRL.RXEN changes only while it is idle (4.6.7)
SECRXCTRL = 0x08D00
SECRXCTRL_SECRX_DIS = 1 << 0
SECRXCTRL_RX_DIS = 1 << 1  # stop the RX security path ...
SECRXSTAT = 0x08D04
SECRXSTAT_SECRX_RDY = 1 << 0  # ... which then reports itself idle here

RAL0 = 0x05400
RAH0 = 0x05404
RAH_AV = 1 << 31  # address valid


def RXPBSIZE(i: int) -> int:
    """RX packet buffer size of traffic class ``i`` (0..7), in KiB at bit 10."""
    return 0x03C00 + 4 * _check(i, 8)


def TXPBSIZE(i: int) -> int:
    """TX packet buffer size of traffic class ``i`` (0..7), in KiB at bit 10."""
    return 0x0CC00 + 4 * _check(i, 8)


RXPBSIZE_128KB = 0x00020000
TXPBSIZE_40KB = 0x0000A000
RXPBSIZE_DEFAULT = 0x200 << 10  # 512 KiB, the whole buffer in traffic class 0
TXPBSIZE_DEFAULT = 0xA0 << 10  # 160 KiB

# --------------------------------------------------------------------------- RX queues
SRRCTL_BSIZEPACKET_MASK = 0x1F  # packet buffer size in KiB (bits 4:0)
SRRCTL_BSIZEPACKET_UNIT = 1024
SRRCTL_BSIZEHEADER_SHIFT = 8
SRRCTL_DESCTYPE_MASK = 0x7 << 25
SRRCTL_DESCTYPE_ADV_ONEBUF = 0x1 << 25
SRRCTL_DROP_EN = 1 << 28
# Reset value as the spec asks the model to provide it: BSIZEPACKET = 2 KiB (ixy relies on
# it without writing it) and BSIZEHEADER = 256 bytes (4 x 64), descriptor type legacy.
SRRCTL_DEFAULT = 0x2 | (0x4 << SRRCTL_BSIZEHEADER_SHIFT)

RXDCTL_ENABLE = 1 << 25
DCA_RXCTRL_BIT12 = 1 << 12  # undocumented, resets to 1, must be cleared (spec 1.4 step 8)


def RDBAL(i: int) -> int:
    return 0x01000 + 0x40 * _check(i, 64)


def RDBAH(i: int) -> int:
    return 0x01004 + 0x40 * _check(i, 64)


def RDLEN(i: int) -> int:
    return 0x01008 + 0x40 * _check(i, 64)


def RDH(i: int) -> int:
    return 0x01010 + 0x40 * _check(i, 64)


def RDT(i: int) -> int:
    return 0x01018 + 0x40 * _check(i, 64)


def RXDCTL(i: int) -> int:
    return 0x01028 + 0x40 * _check(i, 64)


def SRRCTL(i: int) -> int:
    """SRRCTL: 0x02100 + 4i for queues 0..15, 0x01014 + 0x40i for 16..63."""
    _check(i, 64)
    return 0x02100 + 4 * i if i < 16 else 0x01014 + 0x40 * i


def DCA_RXCTRL(i: int) -> int:
    """DCA_RXCTRL: 0x02200 + 4i for queues 0..15, 0x0100C + 0x40i for 16..63."""
    _check(i, 64)
    return 0x02200 + 4 * i if i < 16 else 0x0100C + 0x40 * i


# --------------------------------------------------------------------------- TX queues
TXDCTL_ENABLE = 1 << 25
TXDCTL_PTHRESH = 36
TXDCTL_HTHRESH = 8 << 8
TXDCTL_WTHRESH = 4 << 16
TXDCTL_THRESH_MASK = 0x7F | (0x7F << 8) | (0x7F << 16)


def TDBAL(i: int) -> int:
    return 0x06000 + 0x40 * _check(i, 64)


def TDBAH(i: int) -> int:
    return 0x06004 + 0x40 * _check(i, 64)


def TDLEN(i: int) -> int:
    return 0x06008 + 0x40 * _check(i, 64)


def TDH(i: int) -> int:
    return 0x06010 + 0x40 * _check(i, 64)


def TDT(i: int) -> int:
    return 0x06018 + 0x40 * _check(i, 64)


def TXDCTL(i: int) -> int:
    return 0x06028 + 0x40 * _check(i, 64)


# ------------------------------------------------------------------ descriptors (1.5)
DESC_SIZE = 16
RX_STATUS_DD = 1 << 0
RX_STATUS_EOP = 1 << 1
RX_STATUS_VP = 1 << 3
RX_ERROR_RXE = 1 << 29  # MAC error, in the status/error dword
TX_CMD_EOP = 1 << 24
TX_CMD_IFCS = 1 << 25
TX_CMD_RS = 1 << 27
TX_CMD_DEXT = 1 << 29
TX_DTYP_DATA = 0x3 << 20
TX_DTYP_CONTEXT = 0x2 << 20
TX_DTYP_MASK = 0xF << 20
# ixy's constant: data descriptor, DEXT, RS, IFCS, EOP (OR the length into bits 15:0).
TX_CMD_TYPE_DATA = TX_CMD_EOP | TX_CMD_IFCS | TX_CMD_RS | TX_CMD_DEXT | TX_DTYP_DATA
assert TX_CMD_TYPE_DATA == 0x2B300000
TX_PAYLEN_SHIFT = 14  # olinfo_status PAYLEN bits 31:14
TX_STATUS_DD = 1 << 0

# ------------------------------------------------------------------- statistics (1.8)
CRCERRS = 0x04000
GPRC = 0x04074
GPTC = 0x04080
GORCL = 0x04088
GORCH = 0x0408C
GOTCL = 0x04090
GOTCH = 0x04094
RUC = 0x040A4
ROC = 0x040AC


def MPC(i: int) -> int:
    return 0x03FA0 + 4 * _check(i, 8)


def RNBC(i: int) -> int:
    return 0x03FC0 + 4 * _check(i, 8)


def QPRC(i: int) -> int:
    return 0x01030 + 0x40 * _check(i, 16)


def QPTC(i: int) -> int:
    return 0x06030 + 0x40 * _check(i, 16)


def QPRDC(i: int) -> int:
    return 0x01430 + 0x40 * _check(i, 16)


MODEL_QUEUES = 16  # queues the model implements (and per-queue counters exist for)

# Every counter the model keeps. Each single 32-bit counter and each low/high pair gets one
# 64-bit slot in the model's control file; a pair maps its *low* offset to the slot and its
# high offset to HIGH_HALF[slot]. Order fixes the slot numbers: append only.
SINGLE_COUNTERS: tuple[int, ...] = (
    GPRC,
    GPTC,
    CRCERRS,
    RUC,
    ROC,
    *(MPC(i) for i in range(8)),
    *(RNBC(i) for i in range(8)),
    *(QPRC(i) for i in range(MODEL_QUEUES)),
    *(QPTC(i) for i in range(MODEL_QUEUES)),
    *(QPRDC(i) for i in range(MODEL_QUEUES)),
)
PAIR_COUNTERS: tuple[tuple[int, int], ...] = ((GORCL, GORCH), (GOTCL, GOTCH))

COUNTER_SLOT: dict[int, int] = {}
HIGH_HALF: dict[int, int] = {}  # high-half offset -> slot of its pair
for _slot, _offset in enumerate(SINGLE_COUNTERS):
    COUNTER_SLOT[_offset] = _slot
for _n, (_low, _high) in enumerate(PAIR_COUNTERS):
    COUNTER_SLOT[_low] = len(SINGLE_COUNTERS) + _n
    HIGH_HALF[_high] = len(SINGLE_COUNTERS) + _n
NUM_COUNTER_SLOTS = len(SINGLE_COUNTERS) + len(PAIR_COUNTERS)
SLOT_GORC = COUNTER_SLOT[GORCL]
SLOT_GOTC = COUNTER_SLOT[GOTCL]
