"""Channels: named, owned outputs whose addresses and credentials outlive any one publisher and any restart."""
