pub fn generate() {}
