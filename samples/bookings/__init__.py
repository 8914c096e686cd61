"""The Bookings sample: an agent that books clinic appointments and sleeps while a human approves."""

from .app import Bookings, Confirmation, Reservations, build, patient_id

__all__ = ["Bookings", "Confirmation", "Reservations", "build", "patient_id"]
