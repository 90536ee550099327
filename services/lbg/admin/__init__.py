"""What cg-admin and the operator commands do: status, route, move, resize."""
