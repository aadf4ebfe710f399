//! The PC's CMOS real-time clock (an MC146818 at ports 0x70/0x71), reduced to what Linux
//! reads: the time (the host's, in UTC), status registers that say it is valid and never
//! mid-update, and the 114 bytes of CMOS RAM.
//!
//! Without it every read of port 0x71 returns 0xff, whose "update in progress" bit never
//! clears: Linux's `rtc_cmos` probe then polls the status register for 10 ms at a time, over
//! and over, each poll a VM exit. That cost tens of milliseconds of every boot on hardware
//! KVM, and under nested virtualization it stalled boots for 15 s and more (an RCU stall
//! report in `mc146818_avoid_UIP`, seen in the L1 harness on 2026-11-25).
//!
//! The guest cannot set the clock: writes to the time registers are ignored, as the time
//! is the host's (the agent sets the guest's system clock at boot). Alarms and periodic
//! interrupts are not emulated; register C never reports one.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::bus::BusDevice;

const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const WEEKDAY: u8 = 0x06;
const DAY: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const STATUS_A: u8 = 0x0a;
const STATUS_B: u8 = 0x0b;
const STATUS_C: u8 = 0x0c;
const STATUS_D: u8 = 0x0d;
/// The century byte where PC firmware keeps it (Linux reads it when the FADT says nothing).
const CENTURY: u8 = 0x32;

/// Register A: 32.768 kHz time base, 1024 Hz rate, and never "update in progress".
const A_DEFAULT: u8 = 0x26;
/// Register B: 24-hour mode, BCD, no interrupts enabled.
const B_24H: u8 = 0x02;
const B_BINARY: u8 = 0x04;
/// Register D: "valid RAM and time".
const D_VALID: u8 = 0x80;

/// Where the current time comes from: seconds since the Unix epoch.
pub type Clock = fn() -> u64;

fn host_clock() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The CMOS RTC at ports 0x70 (register index) and 0x71 (data).
pub struct Rtc {
    index: u8,
    ram: [u8; 128],
    clock: Clock,
}

impl Default for Rtc {
    fn default() -> Self {
        Self::new()
    }
}

impl Rtc {
    /// Bus window size: the index and the data port.
    pub const LEN: u64 = 2;

    /// An RTC that tells the host's time.
    pub fn new() -> Self {
        Self::with_clock(host_clock)
    }

    /// An RTC that tells `clock`'s time (for tests).
    pub fn with_clock(clock: Clock) -> Self {
        // Registers A, C and D read as constants (below); B is the guest's to set.
        let mut ram = [0; 128];
        ram[usize::from(STATUS_B)] = B_24H;
        Rtc {
            index: 0,
            ram,
            clock,
        }
    }

    fn read_register(&self, reg: u8) -> u8 {
        match reg {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY => self.time(reg),
            STATUS_A => A_DEFAULT,
            // Reading C clears its flags; none are ever raised.
            STATUS_C => 0,
            STATUS_D => D_VALID,
            r => self.ram[usize::from(r)],
        }
    }

    /// A time register, read from the clock only when one is asked for (the guest polls
    /// register A far more often), in the format register B sets.
    fn time(&self, reg: u8) -> u8 {
        let b = self.ram[usize::from(STATUS_B)];
        let encode = |v: i64| -> u8 {
            // Every value here is below 100.
            let v = u8::try_from(v.rem_euclid(100)).unwrap_or(0);
            if b & B_BINARY != 0 {
                v
            } else {
                ((v / 10) << 4) | (v % 10)
            }
        };
        let secs = i64::try_from((self.clock)()).unwrap_or(0);
        let days = secs.div_euclid(86_400);
        let of_day = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        match reg {
            SECONDS => encode(of_day % 60),
            MINUTES => encode(of_day / 60 % 60),
            HOURS => {
                let h = of_day / 3600;
                if b & B_24H != 0 {
                    encode(h)
                } else {
                    // 12-hour mode: 12, 1..11, with bit 7 for PM.
                    let h12 = if h % 12 == 0 { 12 } else { h % 12 };
                    encode(h12) | if h >= 12 { 0x80 } else { 0 }
                }
            }
            // 1 = Sunday; 1970-01-01 was a Thursday.
            WEEKDAY => encode((days + 4).rem_euclid(7) + 1),
            DAY => encode(day),
            MONTH => encode(month),
            YEAR => encode(year % 100),
            _ => encode(year / 100),
        }
    }

    fn write_register(&mut self, reg: u8, value: u8) {
        match reg {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY => {}
            STATUS_A | STATUS_C | STATUS_D => {}
            // Only the format bits of B matter here; the rest (interrupt enables, SET) are
            // kept for the guest to read back.
            r => self.ram[usize::from(r)] = value,
        }
    }
}

impl BusDevice for Rtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        if data.len() != 1 {
            return;
        }
        data[0] = match offset {
            1 => self.read_register(self.index),
            _ => self.index,
        };
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let &[value] = data else { return };
        match offset {
            // Bit 7 of the index masks NMIs on a real PC; the register is the low 7 bits.
            0 => self.index = value & 0x7f,
            _ => self.write_register(self.index, value),
        }
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01: (year, month 1-12, day
/// 1-31). Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-11-25 01:30:45 UTC, a Wednesday.
    fn fixed() -> u64 {
        1_795_570_245
    }

    fn read(rtc: &mut Rtc, reg: u8) -> u8 {
        rtc.write(0, &[reg]);
        let mut b = [0];
        rtc.read(1, &mut b);
        b[0]
    }

    #[test]
    fn tells_the_time_in_bcd_and_never_mid_update() {
        let mut rtc = Rtc::with_clock(fixed);
        assert_eq!(read(&mut rtc, STATUS_A) & 0x80, 0, "update in progress");
        assert_eq!(read(&mut rtc, STATUS_D), D_VALID);
        let got: Vec<u8> = [SECONDS, MINUTES, HOURS, WEEKDAY, DAY, MONTH, YEAR, CENTURY]
            .iter()
            .map(|&r| read(&mut rtc, r))
            .collect();
        assert_eq!(got, [0x45, 0x30, 0x01, 0x04, 0x25, 0x11, 0x26, 0x20]);
    }

    #[test]
    fn binary_and_12_hour_modes_follow_register_b() {
        let mut rtc = Rtc::with_clock(|| fixed() + 12 * 3600);
        rtc.write(0, &[STATUS_B]);
        rtc.write(1, &[B_BINARY | B_24H]);
        assert_eq!(read(&mut rtc, HOURS), 13);
        assert_eq!(read(&mut rtc, MINUTES), 30);
        rtc.write(0, &[STATUS_B]);
        rtc.write(1, &[B_BINARY]);
        assert_eq!(read(&mut rtc, HOURS), 0x80 | 1, "1 PM");
        assert_eq!(read(&mut rtc, STATUS_B), B_BINARY);
    }

    #[test]
    fn cmos_ram_keeps_bytes_and_the_time_cannot_be_set() {
        let mut rtc = Rtc::with_clock(fixed);
        // The NMI mask bit of the index selects the same register.
        rtc.write(0, &[0x80 | 0x40]);
        rtc.write(1, &[0x5a]);
        assert_eq!(read(&mut rtc, 0x40), 0x5a);
        rtc.write(0, &[SECONDS]);
        rtc.write(1, &[0x00]);
        assert_eq!(read(&mut rtc, SECONDS), 0x45);
        rtc.write(0, &[STATUS_A]);
        rtc.write(1, &[0x80]);
        assert_eq!(read(&mut rtc, STATUS_A), A_DEFAULT);
        // Wider accesses are not the chip's: all ones, and no effect.
        let mut two = [0; 2];
        rtc.read(1, &mut two);
        assert_eq!(two, [0xff, 0xff]);
        rtc.write(0, &[1, 2]);
        assert_eq!(read(&mut rtc, 0x40), 0x5a);
    }

    #[test]
    fn dates_across_leap_years_and_eras() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // 2000-02-29 and 2100-03-01 (2100 is not a leap year).
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        assert_eq!(civil_from_days(20_782), (2026, 11, 25));
    }
}
