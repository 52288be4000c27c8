//! Settings of the discipline, the waiting room and the tenant ledger, and their
//! validation.

use std::time::Duration;

use crate::discipline::MAX_BANDS;

/// Longest `max_wait` a room accepts: one day.
pub const MAX_WAIT_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Settings of a [`Discipline`](crate::Discipline).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisciplineSettings {
    /// Number of priority bands, 1 to [`MAX_BANDS`]; band 0 is the highest priority.
    pub bands: u8,
    /// Grants to higher-priority bands that a non-empty band tolerates before it is
    /// served ahead of them; at least 1.
    pub starvation_limit: u32,
    /// Most entries waiting at once; at least 1.
    pub capacity: usize,
}

impl Default for DisciplineSettings {
    /// Three bands, a starvation limit of 8 and room for 1024 entries.
    fn default() -> Self {
        Self {
            bands: 3,
            starvation_limit: 8,
            capacity: 1024,
        }
    }
}

impl DisciplineSettings {
    /// Checks every field's range.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.bands == 0 || self.bands > MAX_BANDS {
            return Err(SettingsError::Bands(self.bands));
        }
        if self.starvation_limit == 0 {
            return Err(SettingsError::StarvationLimit);
        }
        if self.capacity == 0 {
            return Err(SettingsError::Capacity);
        }
        Ok(())
    }
}

/// Settings of a [`WaitingRoom`](crate::WaitingRoom).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomSettings {
    /// How long an entry waits at most before it expires; positive and at most
    /// [`MAX_WAIT_LIMIT`].
    pub max_wait: Duration,
    /// The queue discipline of the room.
    pub discipline: DisciplineSettings,
    /// Waiters a pass offers the turn to, in the discipline's order, before the room
    /// waits for the next capacity event; at least 1.
    pub tries_per_pass: usize,
}

impl Default for RoomSettings {
    /// Ten seconds' wait, the default discipline and 8 tries a pass.
    fn default() -> Self {
        Self {
            max_wait: Duration::from_secs(10),
            discipline: DisciplineSettings::default(),
            tries_per_pass: 8,
        }
    }
}

impl RoomSettings {
    /// Checks every field's range, the discipline's included.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.max_wait.is_zero() || self.max_wait > MAX_WAIT_LIMIT {
            return Err(SettingsError::MaxWait);
        }
        if self.tries_per_pass == 0 {
            return Err(SettingsError::TriesPerPass);
        }
        self.discipline.validate()
    }
}

/// Settings of a [`TenantLedger`](crate::TenantLedger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerSettings {
    /// Most tenants counted by name at once; further tenants share the overflow
    /// entry [`OVERFLOW_TENANT`](crate::OVERFLOW_TENANT). Zero counts every tenant there.
    pub max_tracked: usize,
}

impl Default for LedgerSettings {
    /// 1024 tenants tracked by name.
    fn default() -> Self {
        Self { max_tracked: 1024 }
    }
}

/// A setting out of its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// `bands` is not between 1 and [`MAX_BANDS`].
    #[error("bands must be between 1 and {MAX_BANDS}, got {0}")]
    Bands(u8),
    /// `starvation_limit` is zero.
    #[error("starvation_limit must be at least 1")]
    StarvationLimit,
    /// `capacity` is zero.
    #[error("capacity must be at least 1")]
    Capacity,
    /// `max_wait` is zero or beyond [`MAX_WAIT_LIMIT`].
    #[error("max_wait must be positive and at most one day")]
    MaxWait,
    /// `tries_per_pass` is zero.
    #[error("tries_per_pass must be at least 1")]
    TriesPerPass,
}
