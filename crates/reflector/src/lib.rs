//! reflector
