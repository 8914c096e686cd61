"""The Bookings sample: an agent that books clinic appointments and sleeps while a human approves."""

from .app import Bookings, Confirmation, build

__all__ = ["Bookings", "Confirmation", "build"]
