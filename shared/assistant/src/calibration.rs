//! The calibration of an assistant's confidences ([`tandem_core::calibration`], fitted by
//! `tandem calibrate`): a `calibration.json` beside the assistant's own files, carrying its
//! format version (the HF directory has no manifest of ours to name it in).

use std::path::Path;

use tandem_core::calibration::Calibration;

use crate::error::AssistantError;

/// The calibration file's name in an assistant directory.
pub const CALIBRATION: &str = "calibration.json";

fn failed(path: &Path, message: impl ToString) -> AssistantError {
    AssistantError::Calibration {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// The calibration beside the assistant in `dir`, if there is one.
pub fn load_calibration(dir: &Path) -> Result<Option<Calibration>, AssistantError> {
    let path = dir.join(CALIBRATION);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| failed(&path, e))?;
    Calibration::from_json(&text)
        .map(Some)
        .map_err(|e| failed(&path, e))
}

/// Saves `cal` beside the assistant in `dir`.
pub fn save_calibration(dir: &Path, cal: &Calibration) -> Result<(), AssistantError> {
    let path = dir.join(CALIBRATION);
    std::fs::write(&path, cal.to_json()).map_err(|e| failed(&path, e))
}
